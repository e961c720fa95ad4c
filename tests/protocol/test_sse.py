"""SSE framing: the decoder's corner cases, the lean data-line reader, and the encoder."""

from __future__ import annotations

from protocol.sse import DONE, DataLines, SSEDecoder, SSEEvent, encode_data, encode_event


def decode(text: str) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = [e for line in text.split("\n") if (e := decoder.feed(line)) is not None]
    last = decoder.end()
    return events + ([last] if last is not None else [])


def test_data_lines_of_one_event_are_joined_with_newlines() -> None:
    assert decode('data: {"a":\ndata: 1}\n\n') == [SSEEvent('{"a":\n1}')]


def test_comments_are_skipped() -> None:
    assert decode(": keep-alive\n\ndata: x\n\n") == [SSEEvent("x")]


def test_event_field_names_the_event_and_does_not_leak_to_the_next() -> None:
    events = decode("event: message_start\ndata: 1\n\ndata: 2\n\n")
    assert events == [SSEEvent("1", "message_start"), SSEEvent("2")]


def test_space_after_colon_is_optional_and_only_one_is_removed() -> None:
    assert decode("data:x\n\ndata:  y\n\n") == [SSEEvent("x"), SSEEvent(" y")]


def test_unknown_fields_and_empty_events_are_ignored() -> None:
    assert decode("retry: 100\nfoo: bar\n\n\n\ndata: z\n\n") == [SSEEvent("z")]


def test_last_event_without_blank_line_is_still_delivered() -> None:
    assert decode("data: [DONE]") == [SSEEvent("[DONE]")]


def test_id_persists_across_events() -> None:
    events = decode("id: 7\ndata: a\n\ndata: b\n\n")
    assert [e.id for e in events] == ["7", "7"]


def test_data_lines_cut_between_body_pieces_are_joined() -> None:
    lines = DataLines()
    assert lines.feed(b'data: {"a": 1}\n\ndata: {"b"') == [b'{"a": 1}']
    assert lines.feed(b": 2}\n\n: keep-alive\nevent: x\n") == [b'{"b": 2}']
    assert lines.feed(b"data: [DONE]") == []
    assert lines.end() == [b"[DONE]"], "a last line without its line break still counts"
    assert lines.end() == []


def test_encoded_frames_decode_to_what_was_encoded() -> None:
    assert encode_data({"a": 1}) == b'data: {"a":1}\n\n'
    assert encode_event("message_stop", {"type": "message_stop"}) == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    lines = DataLines()
    assert lines.feed(encode_data({"a": 1}) + DONE) == [b'{"a":1}', b"[DONE]"]

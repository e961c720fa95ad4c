"""OpenAI chat <-> Anthropic Messages translation, both ways, requests, responses and streams."""

from __future__ import annotations

import json

import msgspec
import pytest

from gateway.translate.anthropic_to_openai import messages_request_to_chat
from gateway.translate.anthropic_to_openai_answers import messages_to_chat_response
from gateway.translate.errors import TranslationError
from gateway.translate.openai_to_anthropic import chat_to_messages
from gateway.translate.openai_to_anthropic_answers import ChatToMessagesStream, chat_response_to_message
from gateway.upstreams.providers.anthropic_errors import (
    anthropic_status_error,
    anthropic_stream_error,
    error_type_for_status,
)
from gateway.upstreams.providers.anthropic_stream import MessagesToChatStream
from gateway.upstreams.providers.errors import ProviderError
from protocol import InvalidRequestError
from protocol.anthropic import MessagesRequest
from protocol.chunk import Usage, chunk_from
from protocol.openai import decode_request

# -- to the Messages API ---------------------------------------------------------------------------


def test_system_messages_become_system_and_turns_alternate() -> None:
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "user", "content": [{"type": "text", "text": "there"}]},
            {"role": "developer", "content": "No emoji."},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"},
        ],
    }
    out = chat_to_messages(body, model="claude-x", default_max_tokens=99)
    assert out["system"] == "Be brief.\n\nNo emoji."
    assert out["model"] == "claude-x"
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "Hi"},
        {"type": "text", "text": "there"},
    ]
    assert out["messages"][1]["content"] == "Hello"


def test_max_tokens_defaults_from_config_and_prefers_max_completion_tokens() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert chat_to_messages({"messages": messages}, model="m", default_max_tokens=77)["max_tokens"] == 77
    body = {"messages": messages, "max_tokens": 5, "max_completion_tokens": 9}
    assert chat_to_messages(body, model="m", default_max_tokens=77)["max_tokens"] == 9


def test_sampling_fields_map_and_temperature_is_clamped() -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "stop": "END",
        "temperature": 1.7,
        "top_p": 0.9,
        "top_k": 40,
        "user": "u1",
        "stream": True,
    }
    out = chat_to_messages(body, model="m", default_max_tokens=10)
    assert out["stop_sequences"] == ["END"]
    assert out["temperature"] == 1.0
    assert (out["top_p"], out["top_k"]) == (0.9, 40)
    assert out["metadata"] == {"user_id": "u1"}
    assert out["stream"] is True


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "system", "content": "only system"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "Hi"}], "n": 2}, "n"),
    ],
)
def test_untranslatable_requests_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(TranslationError) as info:
        chat_to_messages(body, model="m", default_max_tokens=10)
    assert info.value.param == param


# -- from the Messages API -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"), ("tool_use", "tool_calls")],
)
def test_response_maps_content_stop_reason_and_usage(stop_reason: str, finish: str) -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "content": [
            {"type": "text", "text": "Hel"},
            {"type": "thinking", "thinking": "x"},
            {"type": "text", "text": "lo"},
        ],
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 4},
    }
    out = messages_to_chat_response(message, model="tiny", created=5)
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert out["choices"][0]["finish_reason"] == finish
    assert out["model"] == "tiny"
    assert out["usage"] == {
        "prompt_tokens": 14,
        "completion_tokens": 3,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def anthropic_events(texts: list[str], stop_reason: str = "end_turn") -> list[tuple[str, dict]]:
    events = [
        ("message_start", {"type": "message_start", "message": {"id": "msg_9", "usage": {"input_tokens": 7, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]  # fmt: skip
    for text in texts:
        delta = {"type": "text_delta", "text": text}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": len(texts)}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return events


def test_stream_events_become_openai_chunks_with_usage_last() -> None:
    translator = MessagesToChatStream(provider="p", model="tiny", created=1, include_usage=True)
    chunks = [
        c
        for name, data in anthropic_events(["Hi", " there"], "max_tokens")
        for c in translator.feed(name, data)
    ]
    translator.end()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:3]] == ["Hi", " there"]
    assert chunks[3]["choices"][0]["finish_reason"] == "length"
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 2
    assert chunks[4]["usage"]["prompt_tokens"] == 7
    assert all(c["id"] == "msg_9" and c["model"] == "tiny" for c in chunks)


def test_the_opening_chunk_carries_the_prompt_counted_in_message_start() -> None:
    """For the gateway's /v1/messages door, whose own message_start needs it before any usage."""
    translator = MessagesToChatStream(provider="p", model="tiny", created=1, include_usage=False)
    start = {"id": "msg_9", "usage": {"input_tokens": 7, "cache_read_input_tokens": 5, "output_tokens": 1}}
    [opening] = translator.feed("message_start", {"type": "message_start", "message": start})
    assert chunk_from(opening).opened_usage == Usage(
        prompt_tokens=12, completion_tokens=0, total_tokens=12, prompt_tokens_details={"cached_tokens": 5}
    )


def test_stream_without_usage_request_has_no_usage_chunk() -> None:
    translator = MessagesToChatStream(provider="p", model="tiny", created=1, include_usage=False)
    chunks = [c for name, data in anthropic_events(["a"]) for c in translator.feed(name, data)]
    assert all("usage" not in c for c in chunks)


def test_stream_ending_without_message_stop_is_broken() -> None:
    translator = MessagesToChatStream(provider="p", model="tiny", created=1, include_usage=False)
    for name, data in anthropic_events(["a", "b"])[:4]:
        translator.feed(name, data)
    with pytest.raises(ProviderError) as info:
        translator.end()
    assert info.value.retryable and info.value.kind == "stream_broken"


@pytest.mark.parametrize(
    ("error_type", "retryable", "status"),
    [("overloaded_error", True, 503), ("api_error", True, 502), ("rate_limit_error", True, 429), ("invalid_request_error", False, 400)],
)  # fmt: skip
def test_error_event_in_stream_maps_to_upstream_error(error_type: str, retryable: bool, status: int) -> None:
    error = anthropic_stream_error("p", {"type": "error", "error": {"type": error_type, "message": "boom"}})
    assert (error.retryable, error.status_code) == (retryable, status)


@pytest.mark.parametrize(
    ("status", "error_type", "retryable", "client_status"),
    [
        (400, "invalid_request_error", False, 400),
        (401, "authentication_error", True, 502),  # our key: a deployment fault, never the client's
        (403, "permission_error", True, 502),
        (404, "not_found_error", True, 502),
        (413, "request_too_large", False, 413),
        (429, "rate_limit_error", True, 429),
        (500, "api_error", True, 500),
        (529, "overloaded_error", True, 503),
    ],
)
def test_http_errors_map_by_type(status: int, error_type: str, retryable: bool, client_status: int) -> None:
    parsed = {"type": "error", "error": {"type": error_type, "message": "nope"}}
    error = anthropic_status_error("p", status, parsed, "", 3.0)
    assert (error.retryable, error.status_code) == (retryable, client_status)
    if not retryable:
        assert error.body is not None and "nope" in error.body["error"]["message"]
    if status == 429:
        assert error.retry_after == 3.0


# -- the front door: Messages in, Messages out ----------------------------------------------------


def decode_messages(body: dict) -> MessagesRequest:
    return msgspec.convert(body, MessagesRequest)


def test_messages_request_becomes_chat_request() -> None:
    request = decode_messages(
        {
            "model": "tiny",
            "max_tokens": 20,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "stop_sequences": ["END"],
            "temperature": 0.2,
            "stream": True,
            "metadata": {"user_id": "u"},
        }
    )
    body = messages_request_to_chat(request).body
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (body["max_tokens"], body["stop"], body["temperature"], body["user"]) == (20, ["END"], 0.2, "u")
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("role", "block", "param"),
    [
        ("user", {"type": "image", "source": {}}, "messages[0].content[0].type"),
        ("user", {"type": "document", "source": {}}, "messages[0].content[0].type"),
        ("assistant", {"type": "thinking", "thinking": "hm"}, "messages[0].content[0].type"),
        ("user", {"type": "tool_use", "id": "t", "name": "f", "input": {}}, "messages[0].content[0].type"),
        ("assistant", {"type": "tool_result", "tool_use_id": "t"}, "messages[0].content[0].type"),
    ],
)
def test_a_block_meridian_cannot_serve_or_in_the_wrong_role_is_refused_naming_it(
    role: str, block: dict, param: str
) -> None:
    body = {"model": "tiny", "max_tokens": 5, "messages": [{"role": role, "content": [block]}]}
    with pytest.raises(InvalidRequestError) as info:
        decode_request(json.dumps(body).encode(), MessagesRequest)
    assert info.value.param == param and repr(block["type"]) in info.value.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [], "tool_choice": {"type": "tool", "name": "f"}}, "tool_choice"),
        ({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"thinking": {"type": "adaptive"}}, "thinking"),
    ],
)
def test_server_tools_a_choice_without_tools_and_thinking_are_refused_by_name(
    fields: dict, param: str
) -> None:
    base = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(TranslationError) as info:
        messages_request_to_chat(decode_messages({**base, **fields}))
    assert info.value.param == param


def test_a_last_assistant_message_is_continued_not_answered_in_a_new_turn() -> None:
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello,"}]
    base = {"model": "tiny", "max_tokens": 5}
    body = messages_request_to_chat(decode_messages({**base, "messages": turns})).body
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    body = messages_request_to_chat(decode_messages({**base, "messages": turns[:1]})).body
    assert not {"continue_final_message", "add_generation_prompt"} & set(body)


def test_what_asks_for_no_tools_or_thinking_is_served_without_them() -> None:
    base = {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    for fields in ({"tools": []}, {"tool_choice": {"type": "auto"}}, {"thinking": {"type": "disabled"}}):
        body = messages_request_to_chat(decode_messages({**base, **fields})).body
        assert not {"tools", "tool_choice", "thinking"} & set(body)


def test_chat_response_becomes_message() -> None:
    response = {
        "id": "chatcmpl-abc",
        "model": "tiny",
        "choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}},
    }
    message = chat_response_to_message(response)
    assert message == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "tiny",
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 6,
            "output_tokens": 2,
            "cache_read_input_tokens": 3,
            "cache_creation_input_tokens": 0,
        },
    }


def test_matched_stop_string_reported_by_the_node_becomes_stop_sequence() -> None:
    response = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop", "stop_reason": "END"}]}
    message = chat_response_to_message(response, stop_sequences=["END"])
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")


def test_chunks_become_the_full_event_sequence() -> None:
    stream = ChatToMessagesStream(message_id="msg_1", model="tiny")
    events = stream.start()
    for chunk in (
        {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}},
    ):
        events += stream.feed(chunk_from(chunk))
    events += stream.finish()
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2][1]["content_block"] == {"type": "text", "text": ""}
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "Hi"}
    delta = events[5][1]
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["output_tokens"] == 1 and delta["usage"]["input_tokens"] == 4


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"), (404, "not_found_error"),
     (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"), (503, "overloaded_error")],
)  # fmt: skip
def test_our_statuses_map_to_anthropic_error_types(status: int, error_type: str) -> None:
    assert error_type_for_status(status) == error_type


def test_matched_stop_sequence_survives_the_round_trip_through_an_anthropic_provider() -> None:
    """/v1/messages served by Anthropic: its stop_sequence must reach the client, not end_turn."""
    message = {
        "id": "msg_1",
        "content": [{"type": "text", "text": "x"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    chat = messages_to_chat_response(message, model="tiny", created=1)
    assert chat["choices"][0]["finish_reason"] == "stop"
    back = chat_response_to_message(chat, stop_sequences=["END"])
    assert (back["stop_reason"], back["stop_sequence"]) == ("stop_sequence", "END")


def test_matched_stop_sequence_survives_the_streamed_round_trip() -> None:
    translator = MessagesToChatStream(provider="p", model="tiny", created=1, include_usage=True)
    events = anthropic_events(["a"], "stop_sequence")
    for name, data in events:
        if name == "message_delta":
            data["delta"]["stop_sequence"] = "END"
    front = ChatToMessagesStream(message_id="msg_1", model="tiny", stop_sequences=["END"])
    for name, data in events:
        for chunk in translator.feed(name, data):
            front.feed(chunk_from(chunk))
    delta = next(data for name, data in front.finish() if name == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}

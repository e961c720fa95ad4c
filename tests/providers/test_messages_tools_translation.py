"""Tool use on the `/v1/messages` front door, pure: Anthropic requests with tools, tool_use and
tool_result blocks into OpenAI chat bodies (and back through the Anthropic adapter's direction to
an equivalent Messages request); the pipeline's answers with tool calls into tool_use blocks, whole
and as an event stream whose blocks come one at a time, numbered in order, however the text and
tool call pieces arrive (output safety may release a call's tail after the next call began)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import to_api_error
from gateway.translate.anthropic_to_openai import TOOL_ERROR_PREFIX, messages_request_to_chat
from gateway.translate.chat_request import ChatRequest
from gateway.translate.errors import UntranslatableAnswer
from gateway.translate.openai_to_anthropic import chat_to_messages
from gateway.translate.openai_to_anthropic_answers import (
    ChatToMessagesStream,
    Event,
    chat_response_to_message,
)
from gateway.upstreams.providers.anthropic_errors import anthropic_error
from protocol import InvalidRequestError
from protocol.anthropic import MessagesRequest
from protocol.chunk import chunk_from
from tests.providers.tool_strategies import (
    delta_chunk,
    held_back,
    json_objects,
    names,
    streamed_answers,
    texts,
)

WEATHER = {"name": "get_weather", "description": "The weather.", "input_schema": {"type": "object"}}


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    return messages_request_to_chat(msgspec.convert(body, MessagesRequest)).body


def request(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 16, "messages": messages, **fields}


# -- the request: examples -------------------------------------------------------------------------


def test_a_tool_conversation_becomes_tool_calls_and_tool_messages() -> None:
    body = to_chat(
        request(
            [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me look."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Zürich"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "12 C"}],
                        },
                        {"type": "text", "text": "And in words?"},
                    ],
                },
            ],
            tools=[WEATHER],
        )
    )
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather.",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert "tool_choice" not in body and "parallel_tool_calls" not in body
    arguments = '{"city": "Zürich"}'  # not \u-escaped: input safety reads it as text
    assert body["messages"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12 C"},
        {"role": "user", "content": "And in words?"},
    ]
    assert "continue_final_message" not in body


@pytest.mark.parametrize(
    ("choice", "fields"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "get_weather"},
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        ),
        (
            {"type": "any", "disable_parallel_tool_use": True},
            {"tool_choice": "required", "parallel_tool_calls": False},
        ),
        ({"type": "auto", "disable_parallel_tool_use": False}, {"tool_choice": "auto"}),
        ({"type": "none", "disable_parallel_tool_use": True}, {"tool_choice": "none"}),
    ],
)
def test_tool_choice_maps(choice: dict[str, Any], fields: dict[str, Any]) -> None:
    body = to_chat(request([{"role": "user", "content": "Hi"}], tools=[WEATHER], tool_choice=choice))
    assert {k: body[k] for k in ("tool_choice", "parallel_tool_calls") if k in body} == fields


def test_an_error_result_tells_the_model_in_its_text() -> None:
    """OpenAI's tool messages have no error flag: the text says it instead."""
    body = to_chat(
        request(
            [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": "no such city",
                            "is_error": True,
                        }
                    ],
                },
                {"role": "assistant", "content": "Sorry."},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "is_error": True}]},
            ],
            tools=[WEATHER],
        )
    )
    assert body["messages"][0] == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": TOOL_ERROR_PREFIX + "no such city",
    }
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "t2", "content": TOOL_ERROR_PREFIX}


def test_a_conversation_of_tool_calls_without_tools_still_carries_them() -> None:
    """Routing sends it to an upstream that reads tool calls (protocol/capabilities.py)."""
    body = to_chat(
        request(
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            ]
        )
    )
    assert body["messages"][-1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    # A last message of tool calls is not text to continue (Anthropic's prefill).
    assert "continue_final_message" not in body and "tools" not in body


# -- the request: the round trip ---------------------------------------------------------------------

# Anthropic's input_schema is an object's JSON schema.
schemas = st.fixed_dictionaries(
    {"type": st.just("object")},
    optional={"properties": st.dictionaries(names, st.just({"type": "string"}), max_size=3)},
)


def text_blocks(draw: st.DrawFn) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text} for text in draw(st.lists(texts, max_size=2))]


@st.composite
def tool_definitions(draw: st.DrawFn) -> list[dict[str, Any]]:
    tools = []
    for name in draw(st.lists(names, min_size=1, max_size=4, unique=True)):
        tool: dict[str, Any] = {
            "name": name,
            "input_schema": draw(schemas),
        }
        if draw(st.booleans()):
            tool["description"] = draw(texts)
        if draw(st.booleans()):
            tool["type"] = "custom"
        strict = draw(st.none() | st.booleans())
        if strict is not None:
            tool["strict"] = strict
        tools.append(tool)
    return tools


@st.composite
def conversations(draw: st.DrawFn, tool_names: list[str]) -> list[dict[str, Any]]:
    """Turns alternating from the user's: text, or an assistant's text and tool calls followed by
    a user turn of (some of) their results, in any order, then perhaps text. Ids are unique."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(st.text(min_size=1, max_size=12))}]
    for turn in range(draw(st.integers(0, 4))):
        calls = [
            {"type": "tool_use", "id": f"toolu_{turn}_{k}", "name": draw(st.sampled_from(tool_names)), "input": draw(json_objects)}
            for k in range(draw(st.integers(0, 3)))
        ]  # fmt: skip
        if not calls:
            messages.append({"role": "assistant", "content": draw(st.text(min_size=1, max_size=12))})
            messages.append({"role": "user", "content": draw(st.text(min_size=1, max_size=12))})
            continue
        messages.append({"role": "assistant", "content": text_blocks(draw) + calls})
        answered = draw(st.permutations(calls))[: draw(st.integers(1, len(calls)))]
        results = []
        for call in answered:
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call["id"]}
            content = draw(
                st.none() | texts | st.lists(texts.map(lambda t: {"type": "text", "text": t}), max_size=2)
            )
            if content is not None:
                result["content"] = content
            if draw(st.booleans()):
                result["is_error"] = draw(st.booleans())
            results.append(result)
        messages.append({"role": "user", "content": results + text_blocks(draw)})
    if draw(st.booleans()):
        messages.append({"role": "assistant", "content": draw(st.text(min_size=1, max_size=12))})  # a prefill
    return messages


@st.composite
def tool_requests(draw: st.DrawFn) -> dict[str, Any]:
    tools = draw(tool_definitions())
    tool_names = [tool["name"] for tool in tools]
    body = request(draw(conversations(tool_names)), tools=tools)
    choice = draw(
        st.none()
        | st.sampled_from(["auto", "any", "none"]).map(lambda kind: {"type": kind})
        | st.sampled_from(tool_names).map(lambda name: {"type": "tool", "name": name})
    )
    if choice is not None:
        disable = draw(st.none() | st.booleans())
        if disable is not None:
            choice["disable_parallel_tool_use"] = disable
        body["tool_choice"] = choice
    if draw(st.booleans()):
        body["system"] = draw(st.text(min_size=1, max_size=12))
    return body


def canonical_turns(messages: list[dict[str, Any]]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Each turn's blocks as the Messages API reads them: its tool results (an error's text says
    so), its text joined, its tool calls; empty text left out."""
    turns = []
    for message in messages:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        results = []
        for block in blocks:
            if block["type"] != "tool_result":
                continue
            given = block.get("content") or ""
            text = given if isinstance(given, str) else "".join(part["text"] for part in given)
            results.append(
                (
                    "tool_result",
                    block["tool_use_id"],
                    (TOOL_ERROR_PREFIX if block.get("is_error") else "") + text,
                )
            )
        text = "".join(block["text"] for block in blocks if block["type"] == "text")
        uses = [("tool_use", b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
        turns.append((message["role"], results + ([("text", text)] if text else []) + uses))
    return turns


@settings(max_examples=300, deadline=None)
@given(tool_requests())
def test_a_tool_request_survives_the_round_trip_through_the_chat_format(asked: dict[str, Any]) -> None:
    """Messages → chat (the front door) → Messages (the Anthropic adapter): the same tools and
    tool_choice, and each turn's tool calls and results, paired and in order; each chat message
    names the field it came from (`check_sources`)."""
    chat = messages_request_to_chat(msgspec.convert(asked, MessagesRequest))
    body = chat.body
    check_sources(asked, chat)
    # Each tool call's arguments are its input; each result answers in a tool message of its own,
    # after the calls and before the user's text.
    calls = [call for m in body["messages"] for call in m.get("tool_calls") or []]
    uses = [
        b
        for m in asked["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (u["id"], u["name"], u["input"]) for u in uses
    ]
    roles = [m["role"] for m in body["messages"]]
    for k, role in enumerate(roles):
        if role == "tool":
            assert roles[k - 1] in ("assistant", "tool")

    back = chat_to_messages(body, model="claude-x", default_max_tokens=1)
    assert canonical_turns(back["messages"]) == canonical_turns(asked["messages"])
    assert back.get("system") == asked.get("system")
    assert [
        (t["name"], t.get("description") or None, t["input_schema"], t.get("strict")) for t in back["tools"]
    ] == [
        (t["name"], t.get("description") or None, t["input_schema"], t.get("strict")) for t in asked["tools"]
    ]
    choice = asked.get("tool_choice")
    if choice is None:
        assert "tool_choice" not in back
    else:
        expected = {k: v for k, v in choice.items() if k != "disable_parallel_tool_use"}
        if choice.get("disable_parallel_tool_use") and choice["type"] != "none":
            expected["disable_parallel_tool_use"] = True
        assert back["tool_choice"] == expected


def source_of(asked: dict[str, Any], source: str) -> tuple[str, Any]:
    """What a chat message's source names in the Messages request: ("system", text), a turn
    ("user"/"assistant", its message) or a tool result block ("tool_result", the block)."""
    if source == "system":
        return "system", asked["system"]
    found = re.fullmatch(r"messages\[(\d+)\](?:\.content\[(\d+)\])?", source)
    assert found is not None, source
    turn = asked["messages"][int(found.group(1))]
    if found.group(2) is None:
        return turn["role"], turn
    block = turn["content"][int(found.group(2))]
    assert block["type"] == "tool_result"
    return "tool_result", block


def check_sources(asked: dict[str, Any], chat: ChatRequest) -> None:
    """The pipeline's errors name chat messages; the door renames them by `chat.sources`, so each
    must name the turn (or tool result block) the message was made of, in order."""
    messages = chat.body["messages"]
    assert len(chat.sources) == len(messages)
    for message, source in zip(messages, chat.sources, strict=True):
        kind, origin = source_of(asked, source)
        if message["role"] == "tool":
            assert kind == "tool_result" and origin["tool_use_id"] == message["tool_call_id"]
        else:
            assert kind == message["role"]
    turns = [int(re.match(r"messages\[(\d+)\]", s).group(1)) for s in chat.sources if s != "system"]
    assert turns == sorted(turns) and set(turns) == set(range(len(asked["messages"])))
    # A message's error names its source; other fields keep their names.
    last = len(messages) - 1
    error = chat.in_request_terms(
        InvalidRequestError(f"`messages[{last}].role` is bad.", param=f"messages[{last}].role")
    )
    assert (error.param, error.message) == (chat.sources[last], f"`{chat.sources[last]}` is bad.")
    assert chat.in_request_terms(InvalidRequestError("x", param="max_tokens")).param == "max_tokens"


# -- the whole answer ---------------------------------------------------------------------------------


def answer(
    content: str | None, calls: list[tuple[str, str, str]], finish: str = "tool_calls"
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}
            for id_, name, arguments in calls
        ]
    return {
        "id": "chatcmpl-1",
        "model": "tiny",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }


def test_tool_calls_become_tool_use_blocks_after_the_text() -> None:
    message = chat_response_to_message(
        answer("Checking.", [("call_1", "get_weather", '{"city": "Oslo"}'), ("call_2", "now", "")])
    )
    assert message["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "call_2", "name": "now", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use"


def test_an_answer_of_tool_calls_alone_has_no_empty_text_block() -> None:
    for content in (None, ""):
        message = chat_response_to_message(answer(content, [("c", "f", "{}")]))
        assert [block["type"] for block in message["content"]] == ["tool_use"]
    # Without tool calls, an empty answer keeps its (empty) text block.
    assert chat_response_to_message(answer("", [], "stop"))["content"] == [{"type": "text", "text": ""}]


def test_tool_calls_ended_as_stop_are_tool_use() -> None:
    """Anthropic's clients run the tools when the message stops for tool_use."""
    assert chat_response_to_message(answer(None, [("c", "f", "{}")], "stop"))["stop_reason"] == "tool_use"


@pytest.mark.parametrize("arguments", ['{"city": "Os', "[1, 2]", '"text"', "not json"])
def test_arguments_that_are_not_a_json_object_are_the_upstreams_fault(arguments: str) -> None:
    """Not passed on half-read: a 502 `api_error` in Anthropic's format, naming the tool."""
    with pytest.raises(UntranslatableAnswer) as info:
        chat_response_to_message(answer(None, [("c", "get_weather", arguments)]))
    error = to_api_error(info.value)
    assert error.status_code == 502
    assert anthropic_error(error) == {
        "type": "error",
        "error": {"type": "api_error", "message": info.value.message},
    }
    assert "'get_weather'" in info.value.message


# -- the stream --------------------------------------------------------------------------------------


def translate_stream(chunks: list[dict[str, Any]]) -> list[Event]:
    stream = ChatToMessagesStream(message_id="msg_1", model="tiny")
    events = stream.start()
    for chunk in chunks:
        events += stream.feed(chunk_from(chunk))
    return events + stream.finish()


def accumulate(events: list[Event]) -> list[dict[str, Any]]:
    """The message's blocks as an Anthropic client builds them, checking the order it relies on:
    blocks numbered 0, 1, ... as they start, each started and stopped once, no two open at once,
    every delta for the open block."""
    blocks: list[dict[str, Any]] = []
    json_text: dict[int, str] = {}
    open_index = None
    for name, data in events:
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            blocks.append(dict(data["content_block"]))
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
            delta = data["delta"]
            if delta["type"] == "text_delta":
                assert blocks[open_index]["type"] == "text"
                blocks[open_index]["text"] += delta["text"]
            else:
                assert delta["type"] == "input_json_delta" and blocks[open_index]["type"] == "tool_use"
                json_text[open_index] = json_text.get(open_index, "") + delta["partial_json"]
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert open_index is None
    for index, text in json_text.items():
        blocks[index]["input"] = json.loads(text)
    return blocks


def check_stream(events: list[Event], text: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names_ = [name for name, _ in events]
    assert names_[:2] == ["message_start", "ping"] and names_[-2:] == ["message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == ("tool_use" if calls else "end_turn")
    assert events[-2][1]["usage"]["output_tokens"] == 7
    blocks = accumulate(events)
    assert "".join(block["text"] for block in blocks if block["type"] == "text") == text
    uses = [block for block in blocks if block["type"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [
        (c["id"], c["name"], c["input"]) for c in calls
    ]
    if not text and not calls:
        assert blocks == [{"type": "text", "text": ""}]  # as the whole message has
    return blocks


@settings(max_examples=300, deadline=None)
@given(streamed_answers())
def test_streamed_text_and_tool_calls_become_blocks_in_order(streamed: Any) -> None:
    chunks, text, calls = streamed
    blocks = check_stream(translate_stream(chunks), text, calls)
    # Streamed as they came, the blocks are the whole message's: the text, then each call.
    whole = answer(
        text or None,
        [(c["id"], c["name"], json.dumps(c["input"])) for c in calls],
        "tool_calls" if calls else "stop",
    )
    assert blocks == chat_response_to_message(whole)["content"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(streamed_answers(), st.integers(0, 40))
def test_pieces_released_late_by_output_safety_still_make_whole_blocks(streamed: Any, hold: int) -> None:
    """A channel's held tail comes out at the finish, after later calls began: a tool_use block is
    not closed before its arguments are whole, and text that comes late gets a block of its own."""
    chunks, text, calls = streamed
    check_stream(translate_stream(held_back(chunks, hold)), text, calls)


def test_a_call_announced_without_arguments_has_empty_input() -> None:
    announce = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "now", "arguments": ""}}
    chunks = [delta_chunk({"tool_calls": [announce]}), delta_chunk({}, "tool_calls")]
    blocks = accumulate(translate_stream(chunks))
    assert blocks == [{"type": "tool_use", "id": "call_1", "name": "now", "input": {}}]


def test_arguments_that_are_not_a_json_object_end_the_stream_with_an_error() -> None:
    announce = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": '},
    }
    events = translate_stream([delta_chunk({"tool_calls": [announce]}), delta_chunk({}, "tool_calls")])
    assert [name for name, _ in events][-2:] == ["content_block_stop", "error"]
    assert events[-1][1]["error"]["type"] == "api_error" and "'f'" in events[-1][1]["error"]["message"]


def test_a_failed_stream_closes_its_open_block_then_says_why() -> None:
    stream = ChatToMessagesStream(message_id="msg_1", model="tiny")
    stream.start()
    announce = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a"'},
    }
    opened = stream.feed(chunk_from(delta_chunk({"content": "Hi"}))) + stream.feed(
        chunk_from(delta_chunk({"tool_calls": [announce]}))
    )
    assert [(name, data.get("index")) for name, data in opened] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
    ]
    ended = stream.failed("api_error", "upstream gone")
    assert ended == [
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("error", {"type": "error", "error": {"type": "api_error", "message": "upstream gone"}}),
    ]

"""OpenAI tool calling through an Anthropic provider: tools, tool_choice, tool calls and tool
results in the request; tool_use blocks in the answer; tool_use blocks and input_json_delta events
in the stream. And the OpenAI fields the Messages API cannot express, refused by name."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.translate.anthropic_to_openai_answers import messages_to_chat_response
from gateway.translate.errors import TranslationError
from gateway.translate.openai_to_anthropic import chat_to_messages
from gateway.upstreams.providers import AnthropicAdapter, ProviderEntry, ProviderError
from gateway.upstreams.providers.anthropic_stream import MessagesToChatStream
from protocol.chunk import chunk_from, completion_from
from tests.providers.conftest import provider_entry
from tests.providers.tool_strategies import json_objects, names, texts
from tests.support.chunks import as_wire
from tests.support.fake_providers import TOOL_CALL_ARGUMENTS, FakeProvider

CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": CITY_SCHEMA},
}


def translate(body: dict[str, Any]) -> dict[str, Any]:
    return chat_to_messages(body, model="claude-x", default_max_tokens=64)


def refused_param(body: dict[str, Any]) -> str | None:
    with pytest.raises(TranslationError) as info:
        translate(body)
    return info.value.param


# -- the request: examples -------------------------------------------------------------------------


def test_a_tool_conversation_becomes_tool_use_and_tool_result_blocks() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    body = {
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "12 C"}]},
            {"role": "user", "content": "And in words?"},
        ],
    }
    out = translate(body)
    assert out["tools"] == [
        {"name": "get_weather", "description": "The weather in a city.", "input_schema": CITY_SCHEMA}
    ]
    assert out["tool_choice"] == {"type": "auto"}
    assert out["messages"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "12 C"},
                {"type": "text", "text": "And in words?"},
            ],
        },
    ]


def test_no_parameters_is_an_empty_object_schema_and_empty_arguments_an_empty_input() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "now", "arguments": ""}}
    body = {
        "tools": [{"type": "function", "function": {"name": "now"}}],
        "messages": [{"role": "user", "content": "Time?"}, {"role": "assistant", "content": None, "tool_calls": [call]}],
    }  # fmt: skip
    out = translate(body)
    assert out["tools"] == [{"name": "now", "input_schema": {"type": "object", "properties": {}}}]
    assert "tool_choice" not in out
    assert out["messages"][1]["content"] == [{"type": "tool_use", "id": "c", "name": "now", "input": {}}]


@pytest.mark.parametrize(
    ("fields", "tool_choice"),
    [
        ({"tool_choice": "auto"}, {"type": "auto"}),
        ({"tool_choice": "none"}, {"type": "none"}),
        ({"tool_choice": "required"}, {"type": "any"}),
        ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, {"type": "tool", "name": "get_weather"}),
        ({"parallel_tool_calls": False}, {"type": "auto", "disable_parallel_tool_use": True}),
        ({"tool_choice": "required", "parallel_tool_calls": False}, {"type": "any", "disable_parallel_tool_use": True}),
        ({"tool_choice": "none", "parallel_tool_calls": False}, {"type": "none"}),
        ({"parallel_tool_calls": True}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_tool_choice_maps(fields: dict[str, Any], tool_choice: dict[str, Any] | None) -> None:
    out = translate({"tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": "Hi"}], **fields})
    assert out.get("tool_choice") == tool_choice


def test_tool_choice_is_left_out_without_tools() -> None:
    for tools in (None, []):
        body = {"tools": tools, "tool_choice": "required", "messages": [{"role": "user", "content": "Hi"}]}
        assert not {"tools", "tool_choice"} & set(translate(body))


def test_an_empty_tool_result_has_no_content() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "messages": [
            {"role": "user", "content": "Go"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": ""},
        ]
    }
    assert translate(body)["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "c"}],
    }


# -- the request: what is refused, by name ---------------------------------------------------------

HI = [{"role": "user", "content": "Hi"}]


def with_call(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [*HI, {"role": "assistant", "content": "", "tool_calls": [call]}]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "custom", "custom": {"name": "grammar"}}]}, "tools[0].type"),
        ({"tools": [WEATHER_TOOL, {"type": "function", "function": {"description": "no name"}}]}, "tools[1].function.name"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": with_call("[1, 2]")}, "messages[1].tool_calls[0].function.arguments"),
        ({"messages": with_call('{"city": ')}, "messages[1].tool_calls[0].function.arguments"),
        ({"messages": with_call({"city": "Oslo"})}, "messages[1].tool_calls[0].function.arguments"),
        ({"messages": [*HI, {"role": "tool", "content": "12 C"}]}, "messages[1].tool_call_id"),
        ({"messages": [*HI, {"role": "function", "name": "f", "content": "x"}]}, "messages[1].role"),
    ],
)  # fmt: skip
def test_what_the_messages_api_cannot_express_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    assert refused_param({"messages": HI, **fields}) == param


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "text"}},
        {"logit_bias": {}},
        {"presence_penalty": 0, "frequency_penalty": 0.0},
        {"function_call": "none"},
        {"modalities": ["text"]},
        {"logprobs": False},
        {"parallel_tool_calls": False},
    ],
)
def test_what_asks_for_nothing_more_is_served(fields: dict[str, Any]) -> None:
    assert translate({"messages": HI, **fields})["messages"] == HI


# -- the request: properties -----------------------------------------------------------------------

schemas = st.none() | st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(names, st.just({"type": "string"}), max_size=3)}
)


def content_of(text: str, as_parts: bool) -> Any:
    return [{"type": "text", "text": text}] if as_parts else text


@st.composite
def tool_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    tools = []
    for name in draw(st.lists(names, min_size=1, max_size=4, unique=True)):
        function: dict[str, Any] = {"name": name}
        description, parameters = draw(st.none() | texts), draw(schemas)
        if description is not None:
            function["description"] = description
        if parameters is not None:
            function["parameters"] = parameters
        strict = draw(st.none() | st.booleans())
        if strict is not None:
            function["strict"] = strict
        tools.append({"type": "function", "function": function})
    return tools


@st.composite
def conversations(draw: st.DrawFn, tool_names: list[str]) -> list[dict[str, Any]]:
    """A user-first conversation of text turns, system messages, and assistant tool calls followed
    by (some of) their results in any order, then perhaps the user's text. Ids are unique."""
    first = draw(st.text(min_size=1, max_size=12))
    messages: list[dict[str, Any]] = [{"role": "user", "content": content_of(first, draw(st.booleans()))}]
    ids: set[str] = set()
    for step in draw(st.lists(st.sampled_from(["user", "assistant", "system", "tools"]), max_size=6)):
        if step in ("user", "assistant", "system"):
            role = "developer" if step == "system" and draw(st.booleans()) else step
            messages.append({"role": role, "content": content_of(draw(texts), draw(st.booleans()))})
            continue
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            arguments = draw(json_objects)
            # No arguments are sent as "{}" or as "" (which reads as {}).
            empty = not arguments and draw(st.booleans())
            text = "" if empty else json.dumps(arguments, ensure_ascii=draw(st.booleans()))
            function = {"name": draw(st.sampled_from(tool_names)), "arguments": text}
            # Any id a client may send (`functions.get_weather:0`, dots, spaces, non-ASCII), unique.
            call_id = draw(
                st.just(f"call_{len(messages)}_{len(calls)}")
                | st.text(min_size=1, max_size=12).filter(lambda i: i not in ids)
            )
            ids.add(call_id)
            calls.append({"id": call_id, "type": "function", "function": function})
        messages.append({"role": "assistant", "content": draw(st.none() | texts), "tool_calls": calls})
        answered = draw(st.permutations(calls))[: draw(st.integers(0, len(calls)))]
        for call in answered:
            content = content_of(draw(texts), draw(st.booleans()))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        if draw(st.booleans()):
            messages.append({"role": "user", "content": draw(texts)})
    return messages


@st.composite
def tool_requests(draw: st.DrawFn) -> dict[str, Any]:
    tools = draw(tool_lists())
    tool_names = [tool["function"]["name"] for tool in tools]
    body: dict[str, Any] = {"tools": tools, "messages": draw(conversations(tool_names))}
    choice = draw(
        st.none()
        | st.sampled_from(["auto", "none", "required"])
        | st.sampled_from(tool_names).map(lambda n: {"type": "function", "function": {"name": n}})
    )
    if choice is not None:
        body["tool_choice"] = choice
    parallel = draw(st.none() | st.booleans())
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    return body


def blocks_of(turn: dict[str, Any]) -> list[dict[str, Any]]:
    content = turn["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else "".join(part["text"] for part in content or [])


@settings(max_examples=300, deadline=None)
@given(tool_requests())
def test_tool_requests_become_valid_messages_requests(body: dict[str, Any]) -> None:
    out = translate(body)
    turns = out["messages"]
    messages = body["messages"]

    # Turns alternate, start with the user, and carry no empty text.
    assert [turn["role"] for turn in turns] == ["user", "assistant"] * (len(turns) // 2) + ["user"] * (
        len(turns) % 2
    )
    for turn in turns:
        assert turn["content"] and all(b["text"] for b in blocks_of(turn) if b["type"] == "text")
        if isinstance(turn["content"], list) and len(turn["content"]) == 1:
            assert turn["content"][0]["type"] != "text"  # one text block collapses to a string

    # A user turn's tool results come first; tool_use only in assistant turns.
    for turn in turns:
        kinds = [block["type"] for block in blocks_of(turn)]
        assert kinds == sorted(kinds, key=lambda kind: kind != "tool_result")
        assert ("tool_use" in kinds) <= (turn["role"] == "assistant")
        assert ("tool_result" in kinds) <= (turn["role"] == "user")

    # Every text, tool call and tool result is there, in order.
    said = [(m["role"], text_of(m["content"])) for m in messages if m["role"] in ("user", "assistant")]
    assert [(t["role"], b["text"]) for t in turns for b in blocks_of(t) if b["type"] == "text"] == [
        (role, text) for role, text in said if text
    ]
    calls = [call for m in messages for call in m.get("tool_calls") or []]
    uses = [block for turn in turns for block in blocks_of(turn) if block["type"] == "tool_use"]
    assert [u["name"] for u in uses] == [c["function"]["name"] for c in calls]
    # Ids take the Messages API's pattern, one for one: an id that has it is kept.
    translated = {c["id"]: u["id"] for u, c in zip(uses, calls, strict=True)}
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", u["id"]) for u in uses)
    assert len(set(translated.values())) == len(translated)
    assert all(new == old for old, new in translated.items() if re.fullmatch(r"[A-Za-z0-9_-]+", old))
    for use, call in zip(uses, calls, strict=True):
        assert use["input"] == (
            json.loads(call["function"]["arguments"]) if call["function"]["arguments"] else {}
        )
    results = {m["tool_call_id"]: text_of(m["content"]) for m in messages if m["role"] == "tool"}
    got = [b for turn in turns for b in blocks_of(turn) if b["type"] == "tool_result"]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert [b["tool_use_id"] for b in got] == [translated[i] for i in answered]
    results = {translated[i]: text for i, text in results.items()}
    assert all(b.get("content", "") == results[b["tool_use_id"]] for b in got)

    # Each answered tool_use is answered in the very next (user) turn.
    for k, turn in enumerate(turns):
        for block in blocks_of(turn):
            if block["type"] == "tool_use" and block["id"] in results:
                following = blocks_of(turns[k + 1])
                assert any(
                    b.get("tool_use_id") == block["id"] for b in following if b["type"] == "tool_result"
                )

    # Tools and tool_choice.
    assert [t["name"] for t in out["tools"]] == [t["function"]["name"] for t in body["tools"]]
    for tool, asked in zip(out["tools"], body["tools"], strict=True):
        assert tool["input_schema"] == asked["function"].get(
            "parameters", {"type": "object", "properties": {}}
        )
        assert tool.get("description") == (asked["function"].get("description") or None)
        assert tool.get("strict") == asked["function"].get("strict")
    choice = out.get("tool_choice")
    asked_choice = body.get("tool_choice")
    expected_type = {None: "auto", "auto": "auto", "none": "none", "required": "any"}.get(
        asked_choice if isinstance(asked_choice, str | None) else "", "tool"
    )
    if asked_choice is None and body.get("parallel_tool_calls") is not False:
        assert choice is None
    else:
        assert choice is not None and choice["type"] == expected_type
        disabled = body.get("parallel_tool_calls") is False and expected_type != "none"
        assert choice.get("disable_parallel_tool_use", False) == disabled
    msgspec.json.encode(out)  # all of it is JSON


# -- the answer ------------------------------------------------------------------------------------


def test_tool_use_blocks_become_tool_calls_in_order() -> None:
    message = {
        "id": "msg_1",
        "content": [
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Zürich"}},
            {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 9},
    }
    out = messages_to_chat_response(message, model="tiny", created=1)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking both."
    calls = choice["message"]["tool_calls"]
    assert [(c["id"], c["type"], c["function"]["name"]) for c in calls] == [
        ("toolu_a", "function", "get_weather"),
        ("toolu_b", "function", "now"),
    ]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Zürich"}, {}]
    assert "Zürich" in calls[0]["function"]["arguments"]  # not \u-escaped: safety reads it as text
    typed = completion_from(out).choices[0]  # the gateway's typed answer takes it, and sees the text
    assert typed.channels() == {"content": "Checking both.", "tool:0": '{"city": "Zürich"}', "tool:1": "{}"}


def test_an_answer_of_tool_calls_alone_has_null_content_and_text_alone_no_tool_calls() -> None:
    only_tool = {
        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
        "stop_reason": "tool_use",
    }
    message = messages_to_chat_response(only_tool, model="tiny", created=1)["choices"][0]["message"]
    assert message["content"] is None and len(message["tool_calls"]) == 1
    only_text = {"content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn"}
    message = messages_to_chat_response(only_text, model="tiny", created=1)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Hi"}


# -- the stream ------------------------------------------------------------------------------------

Event = tuple[str, dict[str, Any]]


def split_at(text: str, cuts: list[int]) -> list[str]:
    points = [0, *sorted(cut % (len(text) + 1) for cut in cuts), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(points)]


def block_start(index: int, block: dict[str, Any]) -> Event:
    return ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def block_delta(index: int, delta: dict[str, Any]) -> Event:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def block_stop(index: int) -> Event:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


MESSAGE_START: Event = ("message_start", {"type": "message_start", "message": {"id": "msg_1"}})
TOOL_USE_END: list[Event] = [
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
    ("message_stop", {"type": "message_stop"}),
]  # fmt: skip


@st.composite
def tool_answers(draw: st.DrawFn) -> tuple[list[Event], list[dict[str, Any]], str]:
    """An Anthropic stream of text and tool_use blocks (tool inputs split at random points, some
    pieces empty), pings anywhere; and the tool calls and text it carries."""
    kinds = draw(
        st.lists(st.sampled_from(["text", "tool"]), min_size=1, max_size=6).filter(lambda k: "tool" in k)
    )
    events, calls, text = [MESSAGE_START], [], ""
    for index, kind in enumerate(kinds):
        if kind == "text":
            said = draw(st.text(min_size=1, max_size=10))
            text += said
            events.append(block_start(index, {"type": "text", "text": ""}))
            pieces = split_at(said, draw(st.lists(st.integers(0, 99), max_size=3)))
            events += [block_delta(index, {"type": "text_delta", "text": piece}) for piece in pieces]
        else:
            call = {"id": f"toolu_{index}", "name": draw(names), "input": draw(json_objects)}
            calls.append(call)
            events.append(
                block_start(index, {"type": "tool_use", "id": call["id"], "name": call["name"], "input": {}})
            )
            arguments = json.dumps(call["input"], ensure_ascii=draw(st.booleans()))
            pieces = split_at(arguments, draw(st.lists(st.integers(0, 999), max_size=6)))
            events += [
                block_delta(index, {"type": "input_json_delta", "partial_json": piece}) for piece in pieces
            ]
        events.append(block_stop(index))
    events += TOOL_USE_END
    for at in draw(st.lists(st.integers(0, len(events)), max_size=4)):
        events.insert(at, ("ping", {"type": "ping"}))
    return events, calls, text


def feed_all(events: list[Event]) -> list[dict[str, Any]]:
    translator = MessagesToChatStream(provider="p", model="tiny", created=1, include_usage=True)
    chunks = [chunk for name, data in events for chunk in translator.feed(name, data)]
    translator.end()
    # What the adapter does with each: the gateway's typed chunk must take it whole.
    return [as_wire(chunk_from(chunk)) for chunk in chunks]


def collect_tool_calls(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool call deltas joined by index, as an OpenAI client does."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            for delta in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(delta["index"], {"id": None, "name": None, "arguments": ""})
                if delta.get("id"):
                    assert call["id"] is None, "a call's id is sent once, with its name"
                    call["id"], call["name"] = delta["id"], delta["function"]["name"]
                arguments = delta["function"].get("arguments")
                call["arguments"] += arguments or ""
                assert arguments != "" or delta.get("id"), "no empty argument pieces"
    assert sorted(calls) == list(range(len(calls)))
    return [calls[index] for index in sorted(calls)]


@settings(max_examples=300, deadline=None)
@given(tool_answers())
def test_streamed_tool_calls_join_into_the_calls_made(
    answer: tuple[list[Event], list[dict[str, Any]], str],
) -> None:
    events, calls, text = answer
    chunks = feed_all(events)
    joined = collect_tool_calls(chunks)
    assert [(c["id"], c["name"]) for c in joined] == [(c["id"], c["name"]) for c in calls]
    assert [json.loads(c["arguments"]) for c in joined] == [c["input"] for c in calls]
    assert "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"]) == text
    finishes = [
        ch["choices"][0]["finish_reason"]
        for ch in chunks
        if ch["choices"] and ch["choices"][0]["finish_reason"]
    ]
    assert finishes == ["tool_calls"]


def test_a_tool_call_streamed_without_input_deltas_has_empty_object_arguments() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}
    empty = {"type": "input_json_delta", "partial_json": ""}
    events = [MESSAGE_START, block_start(0, block), block_delta(0, empty), block_stop(0), *TOOL_USE_END]
    assert collect_tool_calls(feed_all(events)) == [{"id": "toolu_1", "name": "now", "arguments": "{}"}]


# -- the fakes, and the adapter against the Anthropic one ------------------------------------------

ASKED = [{"role": "user", "content": "Weather in Paris?"}]
CHAT = {"model": "tiny", "tools": [WEATHER_TOOL], "messages": ASKED}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
ANSWERED = [
    *ASKED,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
]


@pytest.fixture
async def adapter(fake_anthropic: FakeProvider) -> AsyncIterator[AnthropicAdapter]:
    entry = msgspec.convert(provider_entry(fake_anthropic, "anthropic-us"), ProviderEntry)
    adapter = AnthropicAdapter(entry, fake_anthropic.api_key)
    yield adapter
    await adapter.aclose()


async def test_the_adapter_sends_tools_and_returns_the_tool_call(
    adapter: AnthropicAdapter, fake_anthropic: FakeProvider
) -> None:
    result = as_wire(await adapter.complete("chat", CHAT, {}))
    assert fake_anthropic.requests[-1].body["tools"][0]["name"] == "get_weather"
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == TOOL_CALL_ARGUMENTS

    # With the tool's result, the answer is text again; the call went out as tool_use/tool_result.
    result = as_wire(await adapter.complete("chat", {**CHAT, "messages": ANSWERED}, {}))
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["choices"][0]["message"]["content"] == fake_anthropic.reply
    sent = fake_anthropic.requests[-1].body["messages"]
    assert sent[1]["content"][0]["type"] == "tool_use" and sent[2]["content"][0]["type"] == "tool_result"


async def test_the_adapter_streams_the_tool_call(adapter: AnthropicAdapter) -> None:
    async with adapter.stream("chat", CHAT, {}) as chunks:
        items = [as_wire(chunk) async for chunk in chunks]
    (call,) = collect_tool_calls(items)
    assert (call["id"], call["name"]) == ("toolu_fake1", "get_weather")
    assert json.loads(call["arguments"]) == TOOL_CALL_ARGUMENTS
    assert [c["choices"][0]["finish_reason"] for c in items if c["choices"]][-1] == "tool_calls"


async def test_the_adapter_refuses_what_it_cannot_express_as_unsupported(adapter: AnthropicAdapter) -> None:
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", {**CHAT, "response_format": {"type": "json_object"}}, {})
    assert info.value.kind == "unsupported" and info.value.retryable
    assert "response_format" in str(info.value)


def sse_data(body: str) -> list[dict[str, Any]]:
    """The JSON of each `data:` event (one may span several lines), [DONE] left out."""
    events = []
    for block in body.split("\n\n"):
        data = "\n".join(
            line.removeprefix("data: ") for line in block.split("\n") if line.startswith("data: ")
        )
        if data and data != "[DONE]":
            events.append(json.loads(data))
    return events


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_fake_calls_the_first_tool_until_it_has_a_result(
    fake_openai: FakeProvider, stream: bool
) -> None:
    headers = {"authorization": f"Bearer {fake_openai.api_key}"}
    url = fake_openai.base_url + "/chat/completions"

    def ask(**fields: Any) -> tuple[str, dict[str, Any] | None, str]:
        """(finish_reason, the tool call joined or None, text) of one answer."""
        response = httpx.post(url, json={**CHAT, "stream": stream, **fields}, headers=headers, timeout=10)
        if not stream:
            choice = response.json()["choices"][0]
            message = choice["message"]
            calls = [{"id": c["id"], **c["function"]} for c in message.get("tool_calls") or []]
            return choice["finish_reason"], (calls or [None])[0], message["content"] or ""
        choices = [chunk["choices"][0] for chunk in sse_data(response.text) if chunk["choices"]]
        calls = collect_tool_calls([{"choices": [choice]} for choice in choices])
        text = "".join(choice["delta"].get("content") or "" for choice in choices)
        return choices[-1]["finish_reason"], (calls or [None])[0], text

    finish, call, _ = ask()
    assert finish == "tool_calls" and call is not None
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == TOOL_CALL_ARGUMENTS
    for fields in ({"messages": ANSWERED}, {"tool_choice": "none"}):
        assert ask(**fields) == ("stop", None, fake_openai.reply)

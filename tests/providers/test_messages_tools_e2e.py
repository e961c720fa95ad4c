"""End to end: tool use through the gateway's `/v1/messages`, called with the official `anthropic`
SDK. A real node serves tiny's plain requests but calls no tools, so a request with tools goes
to the provider (a fake OpenAI, or a fake Anthropic whose adapter translates the chat request
back into a Messages request); the fakes answer a request with tools with one call to its first
tool, and in text once the last message is the tool's result. A tenant without commercial
fallback is told, in Anthropic's error format, that nothing it may use serves tools."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.gateway.conftest import NodeProcess, RunningGateway
from tests.providers.gateway_harness import (
    PRIVATE_KEY,
    PROVIDER_IDS,
    US_KEY,
    one_provider_gateway,
)
from tests.support.fake_providers import TOOL_CALL_ARGUMENTS, FakeProvider

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
]
ASKED = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def served(
    request: pytest.FixtureRequest, node: NodeProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, FakeProvider]]:
    with one_provider_gateway(request.param, node, tmp_path_factory.mktemp(f"tools-{request.param}")) as pair:
        yield pair


def sdk(gateway: RunningGateway, key: str = US_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=gateway.url, max_retries=0, timeout=60)


def tool_use_of(message: Any) -> Any:
    (use,) = [block for block in message.content if block.type == "tool_use"]
    return use


def test_create_with_tools_gets_the_providers_tool_call(served: tuple[RunningGateway, FakeProvider]) -> None:
    gateway, fake = served
    raw = sdk(gateway).messages.with_raw_response.create(
        model="tiny",
        max_tokens=64,
        messages=ASKED,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
    )
    message = raw.parse()
    assert raw.headers["x-meridian-node"] == PROVIDER_IDS[fake.kind]
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["tool_use"]  # no empty text block
    use = tool_use_of(message)
    assert (use.name, use.input) == ("get_weather", TOOL_CALL_ARGUMENTS) and use.id
    # The provider was told of both tools, each with its schema, in its own API's shape.
    sent = fake.requests[-1].body["tools"]
    if fake.kind == "openai":
        assert [t["function"]["parameters"] for t in sent] == [t["input_schema"] for t in TOOLS]
    else:
        assert [t["input_schema"] for t in sent] == [t["input_schema"] for t in TOOLS]


def test_a_streamed_tool_call_arrives_whole_in_the_sdks_final_message(
    served: tuple[RunningGateway, FakeProvider],
) -> None:
    gateway, fake = served
    with sdk(gateway).messages.stream(
        model="tiny",
        max_tokens=64,
        messages=ASKED,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
        served_by = stream.response.headers["x-meridian-node"]
    assert served_by == PROVIDER_IDS[fake.kind]
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]  # fmt: skip
    assert len(pieces) > 1  # streamed in pieces, as the provider sent them
    assert final.stop_reason == "tool_use"
    use = tool_use_of(final)
    assert (use.name, use.input) == ("get_weather", TOOL_CALL_ARGUMENTS)
    assert final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_the_next_turn_with_the_tools_result_gets_text(
    served: tuple[RunningGateway, FakeProvider], stream: bool
) -> None:
    gateway, fake = served
    client = sdk(gateway)
    use = tool_use_of(client.messages.create(model="tiny", max_tokens=64, messages=ASKED, tools=TOOLS))  # type: ignore[arg-type]
    turns = [
        *ASKED,
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]},
    ]  # fmt: skip
    request: dict[str, Any] = {"model": "tiny", "max_tokens": 64, "messages": turns, "tools": TOOLS}
    if stream:
        with client.messages.stream(**request) as streamed:
            answer = streamed.get_final_message()
    else:
        answer = client.messages.create(**request)
    assert answer.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "text", None)) for b in answer.content] == [("text", fake.reply)]
    # The provider read the call and its result, paired by the call's id.
    sent = fake.requests[-1].body["messages"]
    if fake.kind == "openai":
        assert sent[-2]["tool_calls"][0]["id"] == use.id
        assert sent[-1] == {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 21 C"}
    else:
        assert sent[-2]["content"][-1] == {
            "type": "tool_use",
            "id": use.id,
            "name": "get_weather",
            "input": TOOL_CALL_ARGUMENTS,
        }
        assert sent[-1]["content"][0] == {
            "type": "tool_result",
            "tool_use_id": use.id,
            "content": "Sunny, 21 C",
        }


def test_without_tools_the_node_still_serves(served: tuple[RunningGateway, FakeProvider]) -> None:
    gateway, fake = served
    heard = len(fake.requests)
    for fields in ({}, {"tools": TOOLS, "tool_choice": {"type": "none"}}):
        raw = sdk(gateway).messages.with_raw_response.create(
            model="tiny",
            max_tokens=4,
            messages=ASKED,  # type: ignore[arg-type]
            **fields,  # type: ignore[arg-type]
        )
        assert raw.headers["x-meridian-node"] == "us-1"
        assert raw.parse().content[0].type == "text"
    assert len(fake.requests) == heard


@pytest.mark.parametrize("stream", [False, True])
def test_a_tenant_without_commercial_fallback_is_told_tools_are_not_served(
    served: tuple[RunningGateway, FakeProvider], stream: bool
) -> None:
    gateway, fake = served
    heard = len(fake.requests)
    client = sdk(gateway, PRIVATE_KEY)
    request: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "messages": ASKED, "tools": TOOLS}
    with pytest.raises(anthropic.BadRequestError) as refused:
        if stream:
            with client.messages.stream(**request) as streamed:
                streamed.get_final_message()
        else:
            client.messages.create(**request)
    body = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "`tools`" in body["error"]["message"]  # type: ignore[index]
    assert len(fake.requests) == heard  # no provider heard of it


@pytest.mark.parametrize("door", ["create", "stream", "count_tokens"])
def test_a_refused_tool_conversation_names_the_clients_own_turn(
    served: tuple[RunningGateway, FakeProvider], door: str
) -> None:
    """The pipeline names chat messages; the system prompt and the split of a turn's tool results
    shift their indices, and the client must be told its own (`messages[1]`, the tool_use turn,
    not the chat request's `messages[2]`)."""
    gateway, fake = served
    heard = len(fake.requests)
    client = sdk(gateway, PRIVATE_KEY)
    turns = [
        *ASKED,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 C"}]},
    ]  # fmt: skip
    request: dict[str, Any] = {"model": "tiny", "system": "Be brief.", "messages": turns}
    with pytest.raises(anthropic.BadRequestError) as refused:
        if door == "count_tokens":
            client.messages.count_tokens(**request)
        elif door == "stream":
            with client.messages.stream(max_tokens=8, **request) as streamed:
                streamed.get_final_message()
        else:
            client.messages.create(max_tokens=8, **request)
    message = refused.value.body["error"]["message"]  # type: ignore[index]
    assert "asked by `messages[1]`" in message, message
    assert len(fake.requests) == heard


# OpenAI's count API is called with the conversation alone (gateway/upstreams/providers).
@pytest.mark.parametrize("served", ["anthropic"], indirect=True)
def test_count_tokens_with_tools_is_counted_by_the_provider(
    served: tuple[RunningGateway, FakeProvider],
) -> None:
    gateway, fake = served
    raw = sdk(gateway).messages.with_raw_response.count_tokens(
        model="tiny",
        messages=ASKED,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "any"},
    )
    assert raw.headers["x-meridian-node"] == "a-anthropic"
    assert raw.parse().input_tokens == len("Weather in Paris?".split())  # the fake counts words
    sent = fake.requests[-1]
    assert sent.path == "/v1/messages/count_tokens"
    assert [t["name"] for t in sent.body["tools"]] == ["get_weather", "get_time"]
    assert sent.body["tool_choice"] == {"type": "any"}

"""End to end: function tools through the gateway's Responses API, called with the official `openai`
SDK. A real node serves tiny's plain requests but calls no tools, so a request with tools goes to
the provider (a fake OpenAI, or a fake Anthropic whose adapter translates the chat request into a
Messages request); the fakes answer a request with tools with one call to its first tool, and in
text once the last message is the tool's result. The agent loop: the call comes back as a
function_call item, the client runs it and sends a function_call_output with
`previous_response_id`, and the provider reads the call and its result. A tenant without
commercial fallback is told, naming `tools`, that nothing it may use serves them; a tool type
other than function is refused by name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.gateway.conftest import NodeProcess, RunningGateway
from tests.providers.gateway_harness import (
    PRIVATE_KEY,
    PROVIDER_IDS,
    US_KEY,
    one_provider_gateway,
)
from tests.support.fake_providers import TOOL_CALL_ARGUMENTS, TOOL_CALL_IDS, FakeProvider

pytestmark = pytest.mark.slow

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TOOLS: list[Any] = [WEATHER, {"type": "function", "name": "get_time", "parameters": {"type": "object"}}]
ASKED = "Weather in Paris?"


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def served(
    request: pytest.FixtureRequest, node: NodeProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, FakeProvider]]:
    with one_provider_gateway(
        request.param, node, tmp_path_factory.mktemp(f"responses-tools-{request.param}")
    ) as pair:
        yield pair


def sdk(gateway: RunningGateway, key: str = US_KEY) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=gateway.url + "/v1", max_retries=0, timeout=60)


def only_call(response: Any) -> Any:
    assert [item.type for item in response.output] == ["function_call"]  # no empty message item
    return response.output[0]


def test_create_with_a_function_tool_gets_the_providers_function_call(
    served: tuple[RunningGateway, FakeProvider],
) -> None:
    gateway, fake = served
    raw = sdk(gateway).responses.with_raw_response.create(model="tiny", input=ASKED, tools=TOOLS)
    response = raw.parse()
    assert raw.headers["x-meridian-node"] == PROVIDER_IDS[fake.kind]
    assert response.status == "completed" and response.incomplete_details is None
    call = only_call(response)
    assert (call.name, json.loads(call.arguments)) == ("get_weather", TOOL_CALL_ARGUMENTS)
    assert (
        call.call_id == TOOL_CALL_IDS[fake.kind] and call.id.startswith("fc_") and call.status == "completed"
    )
    assert response.output_text == ""
    assert [tool.name for tool in response.tools] == ["get_weather", "get_time"]  # type: ignore[union-attr]
    # The provider was told of both tools, each with its schema, in its own API's shape.
    sent = fake.requests[-1].body["tools"]
    if fake.kind == "openai":
        assert [t["function"]["parameters"] for t in sent] == [t["parameters"] for t in TOOLS]
    else:
        assert [t["input_schema"] for t in sent] == [t["parameters"] for t in TOOLS]
    assert sdk(gateway).responses.retrieve(response.id).output == response.output


def test_a_streamed_function_call_arrives_whole_in_the_sdks_final_response(
    served: tuple[RunningGateway, FakeProvider],
) -> None:
    gateway, fake = served
    heard = len(fake.requests)
    with sdk(gateway).responses.stream(model="tiny", input=ASKED, tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert len(fake.requests) == heard + 1 and fake.requests[-1].body["stream"] is True
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    pieces = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    assert pieces and json.loads("".join(pieces)) == TOOL_CALL_ARGUMENTS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    call = only_call(final)
    assert (call.name, json.loads(call.arguments), call.call_id) == (
        "get_weather",
        TOOL_CALL_ARGUMENTS,
        TOOL_CALL_IDS[fake.kind],
    )
    assert final.status == "completed" and final.usage is not None and final.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
def test_the_follow_up_with_the_calls_output_gets_text(
    served: tuple[RunningGateway, FakeProvider], stream: bool
) -> None:
    """The agent loop: previous_response_id carries the call, the new input is its output."""
    gateway, fake = served
    client = sdk(gateway)
    first = client.responses.create(model="tiny", input=ASKED, tools=TOOLS)
    call = only_call(first)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    request: dict[str, Any] = {
        "model": "tiny",
        "input": [result],
        "tools": TOOLS,
        "previous_response_id": first.id,
    }
    if stream:
        with client.responses.stream(**request) as streamed:
            answer = streamed.get_final_response()
    else:
        answer = client.responses.create(**request)
    assert answer.status == "completed" and answer.previous_response_id == first.id
    assert [item.type for item in answer.output] == ["message"]
    assert answer.output_text == fake.reply
    # The provider read the question, the call and its result, paired by the call's id.
    sent = fake.requests[-1].body["messages"]
    if fake.kind == "openai":
        assert sent[0] == {"role": "user", "content": ASKED}
        assert sent[1]["tool_calls"] == [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": call.arguments},
            }
        ]
        assert sent[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"}
    else:
        assert sent[0]["content"] in (ASKED, [{"type": "text", "text": ASKED}])
        assert sent[1]["content"][-1] == {
            "type": "tool_use",
            "id": call.call_id,
            "name": "get_weather",
            "input": TOOL_CALL_ARGUMENTS,
        }
        assert sent[2]["content"][0] == {
            "type": "tool_result",
            "tool_use_id": call.call_id,
            "content": "Sunny, 21 C",
        }
    # The response lists its own input as given; the earlier conversation is its previous one's.
    items = list(client.responses.input_items.list(answer.id, order="asc"))
    assert [(item.type, item.call_id, item.output) for item in items] == [  # type: ignore[union-attr]
        ("function_call_output", call.call_id, "Sunny, 21 C")
    ]


def test_an_unknown_previous_response_is_not_found(served: tuple[RunningGateway, FakeProvider]) -> None:
    gateway, fake = served
    heard = len(fake.requests)
    with pytest.raises(openai.NotFoundError) as missing:
        sdk(gateway).responses.create(model="tiny", input="Hi", previous_response_id="resp_nope")
    assert missing.value.code == "previous_response_not_found"
    assert missing.value.param == "previous_response_id"  # type: ignore[attr-defined]
    # Another tenant's response is not found either.
    mine = sdk(gateway).responses.create(model="tiny", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        sdk(gateway, PRIVATE_KEY).responses.create(model="tiny", input="Hi", previous_response_id=mine.id)
    assert len(fake.requests) == heard  # the node answered the one served


def test_without_tools_the_node_still_serves(served: tuple[RunningGateway, FakeProvider]) -> None:
    gateway, fake = served
    heard = len(fake.requests)
    for fields in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        raw = sdk(gateway).responses.with_raw_response.create(
            model="tiny", input=ASKED, max_output_tokens=4, **fields
        )
        assert raw.headers["x-meridian-node"] == "us-1"
        assert [item.type for item in raw.parse().output] == ["message"]
    assert len(fake.requests) == heard


@pytest.mark.parametrize("stream", [False, True])
def test_a_tenant_without_commercial_fallback_is_told_tools_are_not_served(
    served: tuple[RunningGateway, FakeProvider], stream: bool
) -> None:
    gateway, fake = served
    heard = len(fake.requests)
    client = sdk(gateway, PRIVATE_KEY)
    with pytest.raises(openai.BadRequestError) as refused:
        if stream:
            with client.responses.stream(model="tiny", input=ASKED, tools=TOOLS) as streamed:
                streamed.get_final_response()
        else:
            client.responses.create(model="tiny", input=ASKED, tools=TOOLS)
    assert refused.value.param == "tools"  # type: ignore[attr-defined]
    assert refused.value.type == "invalid_request_error" and "`tools`" in refused.value.message
    # A conversation of calls and results asks for tool calling too, named by its item.
    calls = [
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
    ]
    with pytest.raises(openai.BadRequestError) as conversation:
        client.responses.create(model="tiny", input=[{"role": "user", "content": ASKED}, *calls])
    assert conversation.value.param == "input[1]"  # type: ignore[attr-defined]
    assert "`input[1]`" in conversation.value.message
    assert len(fake.requests) == heard  # no provider heard of it


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "mcp", "server_label": "x", "server_url": "https://example.com/mcp"},
        {"type": "custom", "name": "grammar_tool"},
    ],
)
def test_a_tool_other_than_a_function_is_refused_by_its_type(
    served: tuple[RunningGateway, FakeProvider], tool: dict[str, Any]
) -> None:
    gateway, fake = served
    heard = len(fake.requests)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(gateway).responses.create(model="tiny", input=ASKED, tools=[tool])  # type: ignore[list-item]
    assert refused.value.param == "tools[0].type"  # type: ignore[attr-defined]
    assert refused.value.code == "unsupported_parameter"
    assert len(fake.requests) == heard

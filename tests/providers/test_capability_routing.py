"""Through the real gateway: a request is routed only to upstreams that serve what it asks.

A real node (which calls no tools and refuses structured output, penalties, n > 1, ...) and two
fake providers: "a-anthropic" (whose adapter translates tool calling and nothing else of the kind)
and "b-openai" (which takes every field). The property, over random requests asking random sets
of capabilities: a tenant allowed commercial fallback is served by the first upstream that serves
everything its request asks, never refused by a node that cannot; a tenant without fallback is
told, with a 400 naming the field, what nothing it may use serves, and no provider hears of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import NodeProcess, RunningGateway
from tests.providers.conftest import provider_entry
from tests.providers.gateway_harness import PRIVATE_KEY, US_KEY, listed, running_gateway
from tests.support.fake_providers import TOOL_CALL_ARGUMENTS, FakeProvider, running

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 16}
# A field that asks each capability, as a client would send it (protocol/capabilities.py).
ASKING: dict[str, dict[str, Any]] = {
    "tools": {"tools": TOOLS},
    "structured_output": {"response_format": {"type": "json_object"}},
    "penalties": {"presence_penalty": 0.5},
    "logit_bias": {"logit_bias": {"42": -100}},
    "n": {"n": 2},
    "web_search": {"web_search_options": {}},
    "logprobs": {"logprobs": True},
    "vllm_sampling": {"min_p": 0.2},
}
SERVED_BY = {
    "a-anthropic": frozenset({"tools"}),
    "b-openai": frozenset(ASKING),
    "us-1": frozenset({"logprobs"}),
}


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    with (
        running(FakeProvider("anthropic", api_key="sk-ant-test")) as anthropic,
        running(FakeProvider("openai", api_key="sk-openai-test")) as openai_,
    ):
        yield anthropic, openai_


@pytest.fixture(scope="module")
def gateway(
    node: NodeProcess, fakes: tuple[FakeProvider, FakeProvider], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    anthropic, openai_ = fakes
    entries = [
        provider_entry(anthropic, "a-anthropic", jurisdiction="us"),
        provider_entry(openai_, "b-openai", jurisdiction="us"),
    ]
    env = {entries[0]["api_key_env"]: anthropic.api_key, entries[1]["api_key_env"]: openai_.api_key}
    with running_gateway(
        tmp_path_factory.mktemp("capabilities"), providers=entries, nodes=[listed(node)], env=env
    ) as gw:
        yield gw


def _chat(gw: RunningGateway, body: dict[str, Any], key: str = US_KEY) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60
    )


def _served_by(response: httpx.Response) -> str:
    return response.headers["x-meridian-node"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(asked=st.frozensets(st.sampled_from(sorted(ASKING))), commercial=st.booleans())
def test_a_request_goes_to_the_first_upstream_that_serves_all_it_asks(
    gateway: RunningGateway, fakes: tuple[FakeProvider, FakeProvider], asked: frozenset[str], commercial: bool
) -> None:
    body: dict[str, Any] = dict(CHAT)
    for capability in sorted(asked):
        body.update(ASKING[capability])
    heard = sum(len(f.requests) for f in fakes)
    response = _chat(gateway, body, US_KEY if commercial else PRIVATE_KEY)

    order = ["us-1", "a-anthropic", "b-openai"] if commercial else ["us-1"]
    able = [target for target in order if asked <= SERVED_BY[target]]
    if able:
        assert response.status_code == 200, response.text
        assert _served_by(response) == able[0]
        assert "failed" not in response.headers["x-meridian-route"], "no upstream refused it first"
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    fields = {param for capability in asked for param in ASKING[capability]}
    assert error["param"] in fields, error
    assert "not supported for model 'tiny' by any upstream this tenant may use" in error["message"]
    assert sum(len(f.requests) for f in fakes) == heard, "no provider hears of a refused request"


def test_a_vllm_extension_reaches_the_openai_compatible_provider_as_sent(
    gateway: RunningGateway, fakes: tuple[FakeProvider, FakeProvider]
) -> None:
    _, openai_ = fakes
    body = {**CHAT, "repetition_penalty": 1.3, "guided_choice": ["yes", "no"]}
    response = _chat(gateway, body)
    assert response.status_code == 200, response.text
    assert _served_by(response) == "b-openai"
    sent = openai_.requests[-1].body
    assert (sent["repetition_penalty"], sent["guided_choice"]) == (1.3, ["yes", "no"])


def test_a_tool_call_comes_back_through_the_openai_sdk_from_the_anthropic_provider(
    gateway: RunningGateway, fakes: tuple[FakeProvider, FakeProvider]
) -> None:
    anthropic, _ = fakes
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=US_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=CHAT["messages"], tools=TOOLS
    )  # type: ignore[arg-type]
    answer = raw.parse()
    assert raw.headers["x-meridian-node"] == "a-anthropic"
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == TOOL_CALL_ARGUMENTS  # type: ignore[union-attr]
    sent = anthropic.requests[-1].body
    assert sent["tools"][0]["name"] == "get_weather"
    assert sent["tools"][0]["input_schema"] == TOOLS[0]["function"]["parameters"]

    # The next turn carries the call and its result: the provider gets them as tool_use and
    # tool_result blocks, and answers in text.
    follow_up = [
        *CHAT["messages"],
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=follow_up, tools=TOOLS)  # type: ignore[arg-type]
    assert raw.headers["x-meridian-node"] == "a-anthropic"
    assert raw.parse().choices[0].message.content == anthropic.reply
    turns = anthropic.requests[-1].body["messages"]
    assert turns[1]["content"][-1] == {
        "type": "tool_use",
        "id": call.id,
        "name": "get_weather",
        "input": TOOL_CALL_ARGUMENTS,
    }
    assert (
        turns[2]["content"][0]["type"] == "tool_result" and turns[2]["content"][0]["tool_use_id"] == call.id
    )


def test_a_conversation_with_another_apis_tool_ids_reaches_the_anthropic_provider(
    gateway: RunningGateway, fakes: tuple[FakeProvider, FakeProvider]
) -> None:
    """Ids from other OpenAI-compatible models (`functions.get_weather:0`) do not fit the
    Messages API's id pattern, which the fake enforces as Anthropic does: the adapter renames
    them, the same on the call and its result, and the provider answers."""
    anthropic, _ = fakes
    messages = [*CHAT["messages"]]
    for call_id in ("functions.get_weather:0", "call 1/é"):
        arguments = json.dumps(TOOL_CALL_ARGUMENTS)
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": arguments},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "Sunny"},
        ]
    response = _chat(gateway, {**CHAT, "messages": messages, "tools": TOOLS})
    assert response.status_code == 200, response.text
    assert _served_by(response) == "a-anthropic"
    assert response.json()["choices"][0]["message"]["content"] == anthropic.reply
    turns = anthropic.requests[-1].body["messages"]
    uses = [
        b["id"]
        for t in turns
        if isinstance(t["content"], list)
        for b in t["content"]
        if b["type"] == "tool_use"
    ]
    results = [
        b["tool_use_id"] for t in turns if isinstance(t["content"], list) for b in t["content"] if b["type"] == "tool_result"
    ]  # fmt: skip
    assert uses == results and len(set(uses)) == 2


def test_a_streamed_tool_call_arrives_whole(gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=US_KEY, max_retries=0)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(
        model="tiny",
        messages=CHAT["messages"],  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
    ):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_weather"] and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == TOOL_CALL_ARGUMENTS


def test_tool_choice_none_asks_no_tools_and_the_node_serves_it(gateway: RunningGateway) -> None:
    response = _chat(gateway, {**CHAT, "tools": TOOLS, "tool_choice": "none"})
    assert response.status_code == 200, response.text
    assert _served_by(response) == "us-1"

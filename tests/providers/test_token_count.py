"""Token counting through the real gateway: Anthropic's `/v1/messages/count_tokens` and OpenAI's
`/v1/responses/input_tokens`, called with the official SDKs and raw.

Served by a real node, a count is the `input_tokens` a generation of the same request reports,
whatever the conversation (the node renders the chat template as it does for the generation).
Served by a commercial provider, it is that provider's count API's answer for the translated
conversation. Either way it is routed and failed over like a generation, counts as a request
against the tenant's quota and charges no tokens.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.types import TenantLimits
from tests.gateway.conftest import NodeProcess, RunningGateway, gateway_config, run_gateway
from tests.providers.conftest import provider_entry
from tests.providers.gateway_harness import (
    EU_KEY,
    TENANTS,
    US_KEY,
    dead_node,
    listed,
    running_gateway,
    tenant,
)
from tests.support.fake_providers import FakeProvider, Fault

pytestmark = pytest.mark.slow

CAPPED_KEY = "sk-capped-counter"
CAPPED = dataclasses.replace(
    tenant("capped", CAPPED_KEY), limits=TenantLimits(requests_per_minute=4, context_tokens=16, max_tokens=8)
)
TEXT = st.text(alphabet=st.sampled_from("ab cdé\n日本🙂.,!?"), min_size=1, max_size=30)
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def gateway(node: NodeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    regions = tmp_path_factory.mktemp("count") / "regions.yaml"
    regions.write_text(yaml.safe_dump({"nodes": [listed(node)]}), encoding="utf-8")
    config = gateway_config(regions, home_region="us-east", catalog=[{"name": "tiny", "tier": "small"}])
    with run_gateway(config, tenants=(*TENANTS, CAPPED)) as gw:
        yield gw


def _post(gw: RunningGateway, path: str, body: dict[str, Any], key: str = US_KEY) -> httpx.Response:
    return httpx.post(gw.url + path, json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)


def _all_input(usage: dict[str, Any]) -> int:
    """Anthropic's `input_tokens` leaves out the prompt's cached tokens; a count has them all."""
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]


BLOCKS = st.lists(TEXT.map(lambda text: {"type": "text", "text": text}), min_size=1, max_size=3)
ANTHROPIC_MESSAGES = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXT | BLOCKS}),
    min_size=1,
    max_size=4,
)


@SETTINGS
@given(messages=ANTHROPIC_MESSAGES, system=st.none() | TEXT | BLOCKS)
def test_a_messages_count_is_the_input_tokens_of_its_generation(
    gateway: RunningGateway, messages: list[dict[str, Any]], system: Any
) -> None:
    """A last assistant message is Anthropic's prefill: counted as the continued prompt it is."""
    request: dict[str, Any] = {"model": "tiny", "messages": messages}
    if system is not None:
        request["system"] = system
    counted = _post(gateway, "/v1/messages/count_tokens", request)
    generated = _post(gateway, "/v1/messages", {**request, "max_tokens": 1})
    assert counted.status_code == generated.status_code, (counted.text, generated.text)
    if generated.status_code == 200:
        assert counted.json() == {"input_tokens": _all_input(generated.json()["usage"])}
        assert counted.headers["x-meridian-node"] == "us-1"
        # A stream says the same count in its first event (message_start), not only its last.
        streamed = _post(gateway, "/v1/messages", {**request, "max_tokens": 1, "stream": True})
        assert _all_input(_message_start(streamed)["usage"]) == counted.json()["input_tokens"]


def _message_start(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    first = next(line for line in response.text.splitlines() if line.startswith("data: "))
    event = json.loads(first[6:])
    assert event["type"] == "message_start", event
    return event["message"]


RESPONSES_INPUT = TEXT | st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "developer"]),
            "content": TEXT
            | st.lists(TEXT.map(lambda t: {"type": "input_text", "text": t}), min_size=1, max_size=2),
        }
    ),
    min_size=1,
    max_size=4,
)


@SETTINGS
@given(given_input=RESPONSES_INPUT, instructions=st.none() | TEXT)
def test_a_responses_count_is_the_input_tokens_of_its_response(
    gateway: RunningGateway, given_input: Any, instructions: str | None
) -> None:
    request: dict[str, Any] = {"model": "tiny", "input": given_input}
    if instructions is not None:
        request["instructions"] = instructions
    counted = _post(gateway, "/v1/responses/input_tokens", request)
    generated = _post(gateway, "/v1/responses", {**request, "max_output_tokens": 1})
    assert counted.status_code == generated.status_code, (counted.text, generated.text)
    if generated.status_code == 200:
        expected = generated.json()["usage"]["input_tokens"]
        assert counted.json() == {"object": "response.input_tokens", "input_tokens": expected}


def test_the_sdks_count_and_errors_come_in_each_doors_format(gateway: RunningGateway) -> None:
    claude = anthropic.Anthropic(api_key=US_KEY, base_url=gateway.url, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Count: one two three"}]
    counted = claude.messages.count_tokens(model="tiny", system="Be brief.", messages=messages)  # type: ignore[arg-type]
    made = claude.messages.create(model="tiny", system="Be brief.", messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert counted.input_tokens == _all_input(made.usage.model_dump()) > 0
    # Tools are counted by an upstream that serves them, and this gateway has only a node.
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.count_tokens(
            model="tiny",
            messages=messages,
            tools=[{"name": "x", "input_schema": {"type": "object"}}],  # type: ignore[arg-type, list-item]
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "`tools`" in refused.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="nope", messages=messages)  # type: ignore[arg-type]

    gpt = openai.OpenAI(api_key=US_KEY, base_url=gateway.url + "/v1", max_retries=0, timeout=60)
    count = gpt.responses.input_tokens.count(
        model="tiny", input="Count: one two three", instructions="Be brief."
    )
    assert count.object == "response.input_tokens" and count.input_tokens == counted.input_tokens
    with pytest.raises(openai.BadRequestError) as unsupported:
        gpt.responses.input_tokens.count(model="tiny", input="x", reasoning={"effort": "low"})
    assert unsupported.value.body["param"] == "reasoning"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as unknown:
        gpt.responses.input_tokens.count(model="tiny", input="x", previous_response_id="resp_1")
    assert unknown.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_a_count_is_a_request_against_the_quota_charges_no_tokens_and_ignores_the_context_cap(
    gateway: RunningGateway,
) -> None:
    """The tenant allows 4 requests a minute and 16 tokens of context: a longer prompt is counted
    (a client counts to learn whether it fits), the fifth call is refused, no token is charged."""
    long = {"model": "tiny", "messages": [{"role": "user", "content": "one two three four five " * 8}]}
    too_long = _post(gateway, "/v1/messages", {**long, "max_tokens": 1}, key=CAPPED_KEY)
    assert too_long.status_code == 400, too_long.text
    latency_before = gateway.metric(
        "meridian_gateway_request_duration_seconds_count", model="tiny", stream="false"
    )
    # The refusal above was no request against the quota: it was refused before it.
    counts = [_post(gateway, "/v1/messages/count_tokens", long, key=CAPPED_KEY) for _ in range(4)]
    assert [r.status_code for r in counts] == [200] * 4, counts[-1].text
    assert counts[0].json()["input_tokens"] > 16
    assert counts[-1].headers["x-ratelimit-remaining-requests"] == "0"
    refused = _post(gateway, "/v1/messages/count_tokens", long, key=CAPPED_KEY)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
    quota = httpx.get(
        gateway.url + "/v1/quota", headers={"authorization": f"Bearer {CAPPED_KEY}"}, timeout=10
    )
    assert quota.json()["tokens"]["used"] == 0 and quota.json()["requests"]["used"] == 4
    served = {"tenant": "capped", "model": "tiny", "region": "us-east", "status": "200"}
    assert gateway.metric("meridian_gateway_requests_total", **served) == 4
    # Counts are requests, but no generation: the model's latency histogram does not see them.
    after = gateway.metric("meridian_gateway_request_duration_seconds_count", model="tiny", stream="false")
    assert after == latency_before


def _us(fake: FakeProvider, provider_id: str) -> dict[str, Any]:
    return provider_entry(fake, provider_id, jurisdiction="us")


@pytest.fixture
def providers_only(
    tmp_path: Path, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> Iterator[RunningGateway]:
    """The fleet is down; "a-openai" is tried first, then "b-anthropic"."""
    entries = [_us(fake_openai, "a-openai"), _us(fake_anthropic, "b-anthropic")]
    env = {entries[0]["api_key_env"]: fake_openai.api_key, entries[1]["api_key_env"]: fake_anthropic.api_key}
    with running_gateway(
        tmp_path, providers=entries, nodes=[dead_node("us-1", "us-east", "us")], env=env
    ) as gw:
        yield gw


CONVERSATION = {
    "model": "tiny",
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "one two three"}, {"role": "assistant", "content": "four"}],
}


def test_a_stream_an_anthropic_provider_serves_starts_with_its_prompt_count(
    providers_only: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    """Anthropic's own message_start counts the prompt: the door's message_start passes it on.
    (An OpenAI provider says nothing before its usage chunk; the door's message_start has 0.)"""
    fake_openai.fail_next(Fault(status=500))  # the Anthropic provider serves it
    streamed = _post(providers_only, "/v1/messages", {**CONVERSATION, "max_tokens": 4, "stream": True})
    assert streamed.headers["x-meridian-node"] == "b-anthropic"
    usage = _message_start(streamed)["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["output_tokens"]) == (4, 2, 0)


def test_a_provider_counts_with_its_own_count_api_and_the_translated_conversation(
    providers_only: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    counted = _post(providers_only, "/v1/messages/count_tokens", CONVERSATION)
    assert counted.status_code == 200, counted.text
    assert counted.headers["x-meridian-node"] == "a-openai"
    sent = fake_openai.requests[-1]
    assert sent.path == "/v1/responses/input_tokens"
    assert sent.body == {
        "model": "openai-model-1",
        "input": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "one two three"},
            {"role": "assistant", "content": "four"},
        ],
    }
    assert counted.json() == {"input_tokens": 6}  # the fake counts words

    fake_openai.fail_next(Fault(status=500))
    failed_over = _post(
        providers_only,
        "/v1/responses/input_tokens",
        {"model": "tiny", "input": "one two", "instructions": "x"},
    )
    assert failed_over.status_code == 200, failed_over.text
    assert failed_over.headers["x-meridian-node"] == "b-anthropic"
    assert "after 1 failed" in failed_over.headers["x-meridian-route"]
    sent = fake_anthropic.requests[-1]
    assert sent.path == "/v1/messages/count_tokens"
    assert sent.body == {
        "model": "anthropic-model-1",
        "messages": [{"role": "user", "content": "one two"}],
        "system": "x",
    }
    assert failed_over.json()["input_tokens"] == 3


def test_an_openai_compatible_api_without_the_count_api_is_passed_over_and_not_blamed(
    providers_only: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    """A 404 from an OpenAI-compatible provider means it has no count API: the next target
    counts, and the provider's breaker hears nothing (it still serves generations)."""
    fake_openai.always(Fault(status=404))
    for _ in range(4):  # past the breaker's minimum of calls, were these failures
        counted = _post(providers_only, "/v1/messages/count_tokens", CONVERSATION)
        assert counted.status_code == 200, counted.text
        assert counted.headers["x-meridian-node"] == "b-anthropic"
    fake_openai.always(None)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    served = _post(providers_only, "/v1/chat/completions", chat)
    assert served.status_code == 200 and served.headers["x-meridian-node"] == "a-openai"


def test_a_count_never_leaves_the_tenants_residency(
    providers_only: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    refused = _post(providers_only, "/v1/messages/count_tokens", CONVERSATION, key=EU_KEY)
    assert refused.status_code == 503, refused.text
    assert not fake_openai.requests and not fake_anthropic.requests

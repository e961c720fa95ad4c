"""Speculative decoding through a real node's API (issue 33): the per-request opt-out
(`speculative: false`, validated at the door), and each request's speculative steps in its
Server-Timing decode description and its trace's decode span, checked against the node's own
vllm:spec_decode_* counters.

One node process with two models on one checkpoint whose attention is switched off, so greedy text
falls into cycles that prompt lookup predicts (long accepted runs): `spec` speculates, `plain`
does not; a real gateway in front of it shows that a client's opt-out reaches the node. Requests
run one at a time, so the counters' moves are each request's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.upstreams.providers.openai_adapter import provider_body
from tests.gateway.conftest import GLOBAL_KEY, NODE_TOKEN, RunningGateway, gateway_config, run_gateway
from tests.support.checkpoints import make_checkpoint, scale_attention_output
from tests.support.otlp import OTLPReceiver, ReceivedSpan, otlp_receiver, tracing_env
from tests.support.processes import free_port, python_command, start_process

TOKEN = NODE_TOKEN  # the gateway's token for its nodes
SPEC, PLAIN = "spec", "plain"
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
DESC = re.compile(r'decode;dur=[0-9.]+;desc="steps=(\d+) drafts=(\d+) draft_tokens=(\d+) accepted=(\d+)"')
PROMPT = "one two three four five six seven"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def cyclic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with every attention output projection zeroed: each next token depends on
    the current one only, so greedy text cycles."""
    path = make_checkpoint(tmp_path_factory.mktemp("cyclic"), "llama", "tiny")
    return scale_attention_output(path, 0.0)


@pytest.fixture(scope="module")
def node(cyclic: Path, receiver: OTLPReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    config = tmp_path_factory.mktemp("spec-node") / "node.yaml"
    # Speculate in every step (no back-off): these tests are about reporting, not the policy.
    config.write_text(
        f"""
node_id: spec-node
region: eu-west
jurisdiction: eu
host: 127.0.0.1
port: {port}
models:
  - name: {SPEC}
    path: {cyclic}
    engine:
      speculative: {{num_speculative_tokens: 4, max_batch_size: 64, min_acceptance_rate: 0.0}}
  - name: {PLAIN}
    path: {cyclic}
""",
        encoding="utf-8",
    )
    url = f"http://127.0.0.1:{port}"
    with start_process(
        python_command("-m", "regional_node", "node", "--config", str(config), "--log-level", "warning"),
        env={"MERIDIAN_NODE_TOKEN": TOKEN, **tracing_env(receiver, "meridian-node")},
        ready_url=f"{url}/ready",
        ready_headers={"authorization": f"Bearer {TOKEN}"},
        timeout=90,
    ):
        yield url


@pytest.fixture(scope="module")
def gateway(node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    regions = tmp_path_factory.mktemp("gateway") / "regions.yaml"
    entry = {"node_id": "spec-node", "url": node, "region": "eu-west", "jurisdiction": "eu"}
    regions.write_text(yaml.safe_dump({"nodes": [{**entry, "models": [SPEC, PLAIN]}]}), encoding="utf-8")
    catalog = [{"name": SPEC, "tier": "small"}, {"name": PLAIN, "tier": "large"}]
    with run_gateway(gateway_config(regions, catalog=catalog)) as running:
        yield running


def post(node: str, endpoint: str, model: str = SPEC, *, token: str = TOKEN, **fields: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "max_tokens": 80, "temperature": 0, "ignore_eos": True}
    body["return_token_ids"] = True
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    return httpx.post(
        node + path,
        json={**body, **fields},
        headers={"authorization": f"Bearer {token}"},
        timeout=60.0,
    )


def token_ids(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def spec_counters(node: str, model: str = SPEC) -> dict[str, float]:
    text = httpx.get(node + "/metrics", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10.0).text
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("vllm:spec_decode_").removesuffix("_total")
            if sample.name.startswith("vllm:spec_decode_") and sample.labels.get("model_name") == model:
                if name in COUNTERS:
                    counters[name] = sample.value
    return counters


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {name: int(after[name] - before[name]) for name in COUNTERS}


def described(response: httpx.Response) -> dict[str, int]:
    """The decode part's description in Server-Timing: steps, drafts, draft tokens, accepted."""
    match = DESC.search(response.headers["server-timing"])
    assert match, response.headers["server-timing"]
    return dict(zip(("steps", "drafts", "draft_tokens", "accepted"), map(int, match.groups()), strict=True))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_an_opted_out_request_makes_no_proposals_and_the_same_tokens(node: str, endpoint: str) -> None:
    before = spec_counters(node)
    opted_out = post(node, endpoint, speculative=False)
    after_out = spec_counters(node)
    assert moved(before, after_out) == dict.fromkeys(COUNTERS, 0)
    assert described(opted_out)["drafts"] == 0

    speculated = post(node, endpoint)
    assert token_ids(speculated) == token_ids(opted_out)
    assert moved(after_out, spec_counters(node))["num_accepted_tokens"] > 0
    # `speculative: true` is the default, said out loud.
    assert token_ids(post(node, endpoint, speculative=True)) == token_ids(opted_out)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("value", ["no", 0, [False], {"enabled": False}])
def test_a_speculative_field_that_is_not_a_boolean_is_a_400_naming_it(
    node: str, endpoint: str, value: Any
) -> None:
    before = spec_counters(node)
    response = post(node, endpoint, speculative=value)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "speculative", error
    assert moved(before, spec_counters(node)) == dict.fromkeys(COUNTERS, 0)


def test_server_timing_says_what_the_requests_steps_proposed_and_accepted(node: str) -> None:
    before = spec_counters(node)
    response = post(node, "completions", max_tokens=90)
    ids, usage = token_ids(response), response.json()["usage"]
    counts = described(response)
    # The node's counters moved by exactly this request's own numbers.
    assert moved(before, spec_counters(node)) == {
        "num_drafts": counts["drafts"],
        "num_draft_tokens": counts["draft_tokens"],
        "num_accepted_tokens": counts["accepted"],
    }
    assert counts["accepted"] > 0 and counts["drafts"] <= counts["steps"]
    # Every decode step gives one token of its own plus the proposals it accepted (nothing stops
    # this request early: ignore_eos, no stop strings), after the first token's step.
    assert len(ids) == usage["completion_tokens"] == 90 == 1 + counts["steps"] + counts["accepted"]


def test_a_model_that_does_not_speculate_describes_nothing(node: str) -> None:
    response = post(node, "completions", model=PLAIN)
    assert response.status_code == 200
    assert "decode;dur=" in response.headers["server-timing"]
    assert "desc=" not in response.headers["server-timing"]


def _decode_span(receiver: OTLPReceiver, response_id: str) -> ReceivedSpan:
    def server(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        return next(
            (
                s
                for s in spans
                if s.kind == "server" and s.attributes.get("gen_ai.response.id") == response_id
            ),
            None,
        )

    def decode_of(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        parent = server(spans)
        if parent is None:
            return None
        return next((s for s in spans if s.parent_span_id == parent.span_id and s.name == "decode"), None)

    return decode_of(receiver.wait_for(lambda spans: decode_of(spans) is not None))


def test_the_trace_decode_span_carries_the_requests_speculation(node: str, receiver: OTLPReceiver) -> None:
    response = post(node, "chat", max_tokens=70)
    counts = described(response)
    span = _decode_span(receiver, response.json()["id"])
    attributes = {k.removeprefix("meridian.spec."): v for k, v in span.attributes.items()}
    assert attributes["steps"] == counts["steps"] and attributes["drafts"] == counts["drafts"] > 0
    assert attributes["draft_tokens"] == counts["draft_tokens"]
    assert attributes["accepted_tokens"] == counts["accepted"] > 0
    # accepted_counts[i]: the drafts that accepted i tokens.
    histogram = attributes["accepted_counts"]
    assert sum(histogram) == counts["drafts"]
    assert sum(i * n for i, n in enumerate(histogram)) == counts["accepted"]

    plain = post(node, "chat", model=PLAIN)
    assert token_ids(plain) == token_ids(post(node, "chat"))
    plain_span = _decode_span(receiver, plain.json()["id"])
    assert not any(key.startswith("meridian.spec.") for key in plain_span.attributes)


@pytest.mark.parametrize("stream", [False, True])
def test_an_opt_out_sent_to_the_gateway_reaches_the_node(
    node: str, gateway: RunningGateway, stream: bool
) -> None:
    def through_gateway(**fields: Any) -> list[int]:
        response = post(gateway.url, "chat", token=GLOBAL_KEY, stream=stream, **fields)
        assert response.status_code == 200, response.text
        if not stream:
            return token_ids(response)
        chunks = [line.removeprefix("data: ") for line in response.text.splitlines()]
        events = [json.loads(c) for c in chunks if c.startswith("{")]
        return [t for e in events for choice in e["choices"] for t in choice.get("token_ids") or []]

    before = spec_counters(node)
    opted_out = through_gateway(speculative=False)
    after_out = spec_counters(node)
    assert moved(before, after_out) == dict.fromkeys(COUNTERS, 0)
    assert through_gateway() == opted_out == token_ids(post(node, "chat"))
    assert moved(after_out, spec_counters(node))["num_accepted_tokens"] > 0


def test_the_gateway_refuses_a_speculative_field_that_is_not_a_boolean(
    node: str, gateway: RunningGateway
) -> None:
    before = spec_counters(node)
    response = post(gateway.url, "completions", token=GLOBAL_KEY, speculative="off")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "speculative"
    assert moved(before, spec_counters(node)) == dict.fromkeys(COUNTERS, 0)


def test_an_openai_provider_never_sees_the_field() -> None:
    """OpenAI refuses unknown arguments: the gateway's OpenAI adapter drops Meridian's."""
    body = {"model": SPEC, "messages": [], "speculative": False, "top_k": 3}
    assert provider_body(body, provider_model="gpt-x", stream=False) == {
        "model": "gpt-x",
        "messages": [],
        "stream": False,
    }

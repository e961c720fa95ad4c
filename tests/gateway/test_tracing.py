"""OpenTelemetry traces across a real gateway and real nodes, exported over OTLP/HTTP to a real
receiver (tests/support/otlp.py): one trace per request across both processes, its span tree
(attempts, a continuation after a node is killed mid-stream), its attributes, no prompt text
unless the tenant's policy allows it, and a client's traceparent honoured."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.policy import key_digest
from router.types import TenantPolicy
from tests.gateway.conftest import (
    GLOBAL_KEY,
    NODE_TOKEN,
    TEST_TENANTS,
    NodeProcess,
    RunningGateway,
    break_stream_midway,
    gateway_config,
    run_gateway,
    running_fleet,
    write_regions,
)
from tests.safety.conftest import write_policies
from tests.support.otlp import OTLPReceiver, ReceivedSpan, otlp_receiver, tracing_env

CONTENT_KEY = "sk-test-traced-content"
CONTENT_TENANT = TenantPolicy(
    tenant_id="t-content", api_key_hashes=frozenset({key_digest(CONTENT_KEY)}), trace_content=True
)
# A tenant with content checks (gateway/safety): its checks appear as spans, never the text.
SAFETY_KEY = "sk-test-traced-safety"
SAFETY_POLICY = {"input": ["rules"], "output": ["rules"], "rules": {"pii": "redact", "secrets": "block"}}
REQUEST_TIMEOUT_S = 45.0
GATEWAY_STAGES = {"authenticate", "admission", "quota.admit", "route", "quota.settle"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def nodes(
    llama_checkpoint: Path, receiver: OTLPReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    traced = type("TracedNode", (NodeProcess,), {"extra_env": tracing_env(receiver, "meridian-node")})
    models = {"meridian-small": (llama_checkpoint, "small")}
    placements = [("eu-west-1", "eu-west", "eu"), ("eu-west-2", "eu-west", "eu")]
    with running_fleet(placements, models, tmp_path_factory.mktemp("logs"), node_type=traced) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def gw(
    nodes: list[NodeProcess], receiver: OTLPReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    regions = write_regions(tmp_path_factory.mktemp("gw") / "regions.yaml", nodes)
    env = tracing_env(
        receiver, "meridian-gateway", OTEL_EXPORTER_OTLP_HEADERS="x-collector-key=secret%20value"
    )
    policies = write_policies(tmp_path_factory.mktemp("policies"), {"t-safety": (SAFETY_KEY, SAFETY_POLICY)})
    config = gateway_config(regions, policies=str(policies))
    with run_gateway(config, tenants=(*TEST_TENANTS, CONTENT_TENANT), env=env) as running:
        yield running


@pytest.fixture
def fleet(nodes: list[NodeProcess], gw: RunningGateway) -> list[NodeProcess]:
    """Every node alive and seen healthy by the gateway (restarting one a test killed)."""
    gw.wait_healthy(nodes)
    return nodes


def body(prompt: str, *, stream: bool = False, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": "meridian-small",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }


def post(
    gw: RunningGateway, payload: dict[str, Any], key: str = GLOBAL_KEY, **headers: str
) -> httpx.Response:
    response = httpx.post(
        gw.url + "/v1/chat/completions",
        json=payload,
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=REQUEST_TIMEOUT_S,
    )
    assert response.status_code == 200, response.text
    return response


def gateway_root(receiver: OTLPReceiver, request_id: str) -> ReceivedSpan:
    def mine(span: ReceivedSpan) -> bool:
        return span.service == "meridian-gateway" and span.attributes.get("meridian.request_id") == request_id

    spans = receiver.wait_for(lambda spans: any(mine(s) for s in spans))
    return next(s for s in spans if mine(s))


def whole_trace(receiver: OTLPReceiver, root: ReceivedSpan, *, node_spans: int = 1) -> list[ReceivedSpan]:
    """The root's trace once `node_spans` node request spans (each with its three phases) are in."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        mine = [s for s in spans if s.trace_id == root.trace_id and s.service == "meridian-node"]
        return sum(s.kind == "server" for s in mine) >= node_spans and len(mine) >= 4 * node_spans

    receiver.wait_for(complete)
    return receiver.trace(root.trace_id)


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id]


def test_one_trace_covers_the_gateway_and_the_node_down_to_the_engine_phases(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    response = post(gw, body("Trace me through both processes"))
    root = gateway_root(receiver, response.headers["x-request-id"])
    spans = whole_trace(receiver, root)

    assert root.parent_span_id == "" and root.name == "chat meridian-small"
    assert {s.service for s in spans} == {"meridian-gateway", "meridian-node"}
    below_root = children(spans, root)
    assert GATEWAY_STAGES <= {s.name for s in below_root}
    attempts = [s for s in below_root if s.name.startswith("attempt ")]
    assert len(attempts) == 1 and attempts[0].kind == "client"
    attempt = attempts[0]
    assert attempt.attributes["meridian.outcome"] == "ok"
    assert attempt.attributes["meridian.target"] == response.headers["x-meridian-node"]
    assert attempt.attributes["meridian.region"] == "eu-west"

    (node_span,) = children(spans, attempt)
    assert node_span.service == "meridian-node" and node_span.kind == "server"
    assert node_span.name == "chat meridian-small"
    assert node_span.attributes["meridian.node"] == response.headers["x-meridian-node"]
    assert node_span.attributes["gen_ai.usage.output_tokens"] == 8
    phases = {s.name: s for s in children(spans, node_span)}
    assert set(phases) == {"queue", "prefill", "decode"}
    assert phases["queue"].end_ns <= phases["prefill"].end_ns <= phases["decode"].end_ns
    assert node_span.start_ns <= phases["queue"].start_ns and phases["decode"].end_ns <= node_span.end_ns


def test_the_server_span_carries_genai_and_meridian_attributes(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    response = post(gw, body("Attributes please", max_tokens=6))
    usage = response.json()["usage"]
    root = gateway_root(receiver, response.headers["x-request-id"])
    attributes = root.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "meridian-small"
    assert attributes["gen_ai.response.model"] == "meridian-small"
    assert attributes["gen_ai.request.max_tokens"] == 6
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == 6
    assert attributes["gen_ai.usage.cache_read.input_tokens"] >= 0
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert attributes["meridian.tenant"] == "t-global"
    assert attributes["meridian.region"] == "eu-west"
    assert attributes["meridian.route.reason"] == response.headers["x-meridian-route"]
    assert attributes["meridian.attempts"] == 1
    assert attributes["meridian.continuations"] == 0
    assert attributes["meridian.degraded"] is False
    assert attributes["http.response.status_code"] == 200


def test_no_prompt_or_completion_text_and_no_secret_is_ever_recorded_by_default(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    marker = "zebra-umbrella-4711"
    response = post(gw, body(f"Repeat after me: {marker}", max_tokens=12))
    completion = response.json()["choices"][0]["message"]["content"]
    root = gateway_root(receiver, response.headers["x-request-id"])
    recorded = json.dumps([s.attributes for s in whole_trace(receiver, root)])
    assert marker not in recorded
    assert completion.strip() and completion.strip() not in recorded
    for secret in (GLOBAL_KEY, NODE_TOKEN, "Bearer", "secret value"):
        assert secret not in recorded
    assert "gen_ai.input.messages" not in root.attributes and "gen_ai.output.messages" not in root.attributes
    # The collector's header reached the collector, and only there.
    assert any(h.get("x-collector-key") == "secret value" for h in receiver.export_headers)


def test_each_content_check_is_a_span_under_the_request_without_the_text_it_checked(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    email = "ada.lovelace@example.org"
    response = post(gw, body(f"Write to {email} today", stream=False), key=SAFETY_KEY)
    root = gateway_root(receiver, response.headers["x-request-id"])
    spans = whole_trace(receiver, root)
    checks = [s for s in children(spans, root) if s.name.startswith("safety ")]
    by_where = {
        (s.attributes["meridian.safety.where"], s.attributes["meridian.safety.action"]) for s in checks
    }
    # The e-mail in the prompt was redacted on input; the output was checked too.
    assert ("input", "redact") in by_where and any(where == "output" for where, _ in by_where)
    redacted = next(s for s in checks if s.attributes["meridian.safety.action"] == "redact")
    assert redacted.attributes["meridian.safety.layer"] == "rules"
    assert email not in json.dumps([s.attributes for s in spans])
    # Each check sits inside the request's span in time.
    assert all(root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in checks)


def test_a_tenant_whose_policy_allows_it_gets_prompt_and_completion_in_its_traces(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    marker = "giraffe-teapot-0815"
    response = post(gw, body(f"Say {marker}"), key=CONTENT_KEY)
    root = gateway_root(receiver, response.headers["x-request-id"])
    assert json.loads(root.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "content": f"Say {marker}"}
    ]
    output = json.loads(root.attributes["gen_ai.output.messages"])
    assert output[0]["content"] == response.json()["choices"][0]["message"]["content"]
    node_spans = [s for s in whole_trace(receiver, root) if s.service == "meridian-node"]
    assert marker not in json.dumps([s.attributes for s in node_spans])  # the node never records text

    text = ""
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json=body(f"Stream {marker}", stream=True),
        headers={"authorization": f"Bearer {CONTENT_KEY}"},
        timeout=REQUEST_TIMEOUT_S,
    ) as streamed:
        for line in streamed.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    text += choice.get("delta", {}).get("content") or ""
    streamed_root = gateway_root(receiver, streamed.headers["x-request-id"])
    assert marker in streamed_root.attributes["gen_ai.input.messages"]
    assert json.loads(streamed_root.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "content": text}
    ]


def test_traced_content_has_secrets_and_personal_data_redacted(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    """trace_content records the client's text as the safety docs promise: through redact_secrets."""
    key, mail = "sk-proj-" + "Abcdefghijklmnopqrstuvwx123", "jane.doe@example.com"
    response = post(gw, body(f"My key is {key}, write to {mail}"), key=CONTENT_KEY)
    root = gateway_root(receiver, response.headers["x-request-id"])
    recorded = root.attributes["gen_ai.input.messages"]
    assert key not in recorded and mail not in recorded
    assert "[REDACTED:openai_key]" in recorded and "[REDACTED:email]" in recorded


def test_a_refused_call_is_traced_with_its_failed_authentication_and_a_models_list_is_not(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    models = httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {GLOBAL_KEY}"}, timeout=10)
    assert models.status_code == 200
    refused = httpx.post(
        gw.url + "/v1/chat/completions",
        json=body("Let me in"),
        headers={"authorization": "Bearer sk-wrong"},
        timeout=REQUEST_TIMEOUT_S,
    )
    assert refused.status_code == 401
    root = gateway_root(receiver, refused.headers["x-request-id"])
    assert root.attributes["http.response.status_code"] == 401 and root.status_code == 2
    spans = receiver.wait_for(lambda spans: any(s.parent_span_id == root.span_id for s in spans))
    (authenticate,) = [s for s in spans if s.parent_span_id == root.span_id]
    assert authenticate.name == "authenticate" and authenticate.status_code == 2
    assert "sk-wrong" not in json.dumps([root.attributes, authenticate.attributes])
    listed = models.headers["x-request-id"]
    assert not [s for s in receiver.snapshot() if s.attributes.get("meridian.request_id") == listed]


def test_a_call_the_sampler_leaves_out_is_served_and_left_out_on_the_node_too(
    gw: RunningGateway,
    nodes: list[NodeProcess],
    fleet: list[NodeProcess],
    receiver: OTLPReceiver,
    tmp_path: Path,
) -> None:
    env = tracing_env(receiver, "meridian-gateway-unsampled", OTEL_TRACES_SAMPLER="always_off")
    with run_gateway(gateway_config(write_regions(tmp_path / "regions.yaml", nodes)), env=env) as unsampled:
        unsampled.wait_healthy(nodes)
        answered = post(unsampled, body("Nobody traces me"))
        headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
        with httpx.stream(
            "POST",
            unsampled.url + "/v1/chat/completions",
            json=body("Me neither", stream=True),
            headers=headers,
            timeout=REQUEST_TIMEOUT_S,
        ) as streamed:
            assert streamed.status_code == 200 and "data: [DONE]" in streamed.read().decode()
        ids = {answered.headers["x-request-id"], streamed.headers["x-request-id"]}
    # A traced call afterwards through the first gateway: once its whole trace is in, spans of the
    # unsampled calls (ended earlier, queued on the same exporters) would be in too.
    whole_trace(receiver, gateway_root(receiver, post(gw, body("after")).headers["x-request-id"]))
    leaked = [s for s in receiver.snapshot() if s.attributes.get("meridian.request_id") in ids]
    assert leaked == []
    assert not [s for s in receiver.snapshot() if s.service == "meridian-gateway-unsampled"]


def test_a_client_traceparent_is_the_parent_of_the_whole_request(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    trace_id, parent_id = os.urandom(16).hex(), os.urandom(8).hex()
    response = post(gw, body("Continue my trace"), traceparent=f"00-{trace_id}-{parent_id}-01")
    root = gateway_root(receiver, response.headers["x-request-id"])
    assert (root.trace_id, root.parent_span_id) == (trace_id, parent_id)
    spans = whole_trace(receiver, root)
    assert all(s.trace_id == trace_id for s in spans)
    assert any(s.service == "meridian-node" for s in spans)


def test_a_stream_continued_after_its_node_is_killed_shows_both_attempts_and_the_continuation(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    payload = body("Continue this story", stream=True, max_tokens=400, return_token_ids=True)
    broken = break_stream_midway(gw, fleet, payload)
    request_id, serving = broken.headers["x-request-id"], broken.serving
    token_ids = [
        token
        for line in broken.lines
        if line.startswith("data: {")
        for choice in json.loads(line[6:]).get("choices", [])
        for token in choice.get("token_ids") or []
    ]
    assert len(token_ids) == 400
    survivor = next(n for n in fleet if n is not serving)

    root = gateway_root(receiver, request_id)
    spans = whole_trace(receiver, root)  # the survivor's span; the killed node's never left it
    assert root.attributes["meridian.continuations"] == 1
    assert root.attributes["meridian.attempts"] == 2
    assert root.attributes["gen_ai.usage.output_tokens"] == 400
    assert root.attributes["gen_ai.response.finish_reasons"] == ["length"]
    first = [s for s in children(spans, root) if s.name.startswith("attempt ")]
    assert [s.attributes["meridian.target"] for s in first] == [serving.node_id]
    (continuation,) = [s for s in children(spans, root) if s.name == "continuation"]
    assert continuation.attributes["meridian.continuation.excluded"] == [serving.node_id]
    assert continuation.attributes["meridian.continuation.carried_tokens"] >= 20
    inside = children(spans, continuation)
    assert "route" in {s.name for s in inside}
    (resumed,) = [s for s in inside if s.name.startswith("attempt ")]
    assert resumed.attributes["meridian.target"] == survivor.node_id
    assert resumed.attributes["meridian.outcome"] == "ok"
    (node_span,) = children(spans, resumed)
    assert node_span.attributes["meridian.node"] == survivor.node_id


def test_the_cascade_is_a_span_with_its_verdict(
    gw: RunningGateway, fleet: list[NodeProcess], receiver: OTLPReceiver
) -> None:
    response = post(gw, {**body("Judge me", max_tokens=12), "model": "auto"})
    route = response.headers["x-meridian-route"]
    assert response.json()["model"] == "meridian-small" and route.startswith("auto:small;")
    root = gateway_root(receiver, response.headers["x-request-id"])
    spans = whole_trace(receiver, root)
    (cascade,) = [s for s in children(spans, root) if s.name == "escalation"]
    verdict = cascade.attributes["meridian.escalation.verdict"]
    # This random small model is sure of itself, or the large tier (no node serves it here) failed.
    assert cascade.attributes["meridian.escalated"] is False and route.startswith(verdict)
    assert "confident=score:" in verdict or "escalation_failed=NoRouteError" in verdict

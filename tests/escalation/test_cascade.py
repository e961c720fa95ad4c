"""The confidence cascade end to end, with real nodes: `model: auto` starts on the small tier, the
small model's first K tokens are held back and judged on their logprobs, and the request either
stays (the held tokens go out first, nothing held past K) or is served by the large model from
its first token (the small request aborted, both tiers in the usage ledger, residency kept).

The checkpoints are random, so their logprobs are near -log(vocab) everywhere: the tenants'
thresholds make the verdict certain (0: every score is below; -1000: none is), which is what
these tests need; calibration on a trained pair is `meridian escalation calibrate`'s job.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.policy import key_digest
from router.types import EscalationOverrides, Residency, TenantPolicy
from tests.gateway.conftest import (
    AUTH,
    NodeProcess,
    RunningGateway,
    gateway_config,
    run_gateway,
    running_fleet,
    write_regions,
)

SMALL, LARGE = "meridian-small", "meridian-large"
K = 6
LONG = 2000  # tokens: the small model is still generating when the cascade aborts it (400 once were not)
PROMPT = "Say hello"
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"return_token_ids": True, "ignore_eos": True}}


def tenant(tenant_id: str, threshold: float, *, eu: bool = False) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=tenant_id,
        api_key_hashes=frozenset({key_digest(f"sk-{tenant_id}")}),
        residency=Residency(jurisdictions=frozenset({"eu"})) if eu else Residency(),
        escalation=EscalationOverrides(threshold=threshold),
    )


TENANTS = (
    tenant("doubter", 0.0),  # every score is below 0: always escalates
    tenant("doubter-eu", 0.0, eu=True),
    tenant("truster", -1000.0),  # scores are floored at -100: never escalates
)


@pytest.fixture(scope="module")
def nodes(
    llama_checkpoint: Path, qwen2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    models = {SMALL: (llama_checkpoint, "small"), LARGE: (qwen2_checkpoint, "large")}
    placements = [("eu-west-1", "eu-west", "eu"), ("us-east-1", "us-east", "us")]
    with running_fleet(placements, models, tmp_path_factory.mktemp("cascade-logs")) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cascade-ledger") / "ledger.sqlite"


@pytest.fixture(scope="module")
def gw(
    nodes: list[NodeProcess], ledger_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    regions = write_regions(tmp_path_factory.mktemp("cascade-gw") / "regions.yaml", nodes)
    config = gateway_config(
        regions,
        # Clients in the US: a request goes to the EU only where residency sends it.
        home_region="us-east",
        catalog=[
            {"name": SMALL, "tier": "small", "price": {"input": 0.1, "output": 0.4}},
            {"name": LARGE, "tier": "large", "price": {"input": 2.0, "output": 8.0}},
        ],
        # The doubters escalate every time: neither their history nor the thrash guard may move
        # their next requests to the large tier from the start.
        auto={
            "classifier": {"weights": {"escalation_rate": 0.0}},
            "escalation": {"k_tokens": K, "window": 3},
            "thrash": {"min_requests": 1000},
        },
        ledger={"store": {"type": "sqlite", "path": str(ledger_file)}, "poll_interval_ms": 50},
    )
    with run_gateway(config, tenants=TENANTS) as running:
        yield running


def client(gw: RunningGateway, tenant_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=f"sk-{tenant_id}", max_retries=0)


def direct(node: NodeProcess, model: str, max_tokens: int) -> list[int]:
    """The model's greedy answer, asked of a node directly."""
    with openai.OpenAI(base_url=f"{node.url}/v1", api_key=AUTH["authorization"][7:], max_retries=0) as c:
        reply = c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, **GREEDY
        )
    return reply.choices[0].model_extra["token_ids"]


def stream_auto(gw: RunningGateway, tenant_id: str, max_tokens: int) -> tuple[list[list[int]], Any, dict]:
    """(token ids per content chunk, the usage, the response headers) of a streamed auto request."""
    with client(gw, tenant_id) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
        chunks, usage = [], None
        for chunk in raw.parse():
            for choice in chunk.choices:
                assert (choice.model_extra or {}).get("logprobs") is None and choice.logprobs is None
                ids = (choice.model_extra or {}).get("token_ids")
                if ids:
                    chunks.append(ids)
            usage = chunk.usage or usage
    return chunks, usage, dict(raw.headers)


def node(nodes: list[NodeProcess], node_id: str) -> NodeProcess:
    return next(n for n in nodes if n.node_id == node_id)


def node_requests(node: NodeProcess, model: str, outcome: str) -> float:
    total = 0.0
    for line in node.metrics().splitlines():
        if (
            line.startswith("meridian_node_requests_total{")
            and f'model="{model}"' in line
            and f'outcome="{outcome}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def ledger_events(path: Path, request_id: str, expected: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while True:
        with sqlite3.connect(path) as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(
                "SELECT * FROM usage_events WHERE request_id LIKE ? ORDER BY request_id", (f"{request_id}%",)
            ).fetchall()
        if len(rows) >= expected or time.monotonic() > deadline:
            return [dict(r) for r in rows]
        time.sleep(0.1)


def test_an_escalated_stream_shows_only_the_large_models_tokens(
    gw: RunningGateway, nodes: list[NodeProcess], ledger_file: Path
) -> None:
    us = node(nodes, "us-east-1")
    aborted_before = node_requests(us, SMALL, "disconnected")
    # Long enough that the small model is still generating when the cascade aborts it.
    chunks, usage, headers = stream_auto(gw, "doubter", max_tokens=LONG)

    assert [t for ids in chunks for t in ids] == direct(us, LARGE, LONG)
    assert headers["x-meridian-model"] == LARGE
    assert headers["x-meridian-route"].startswith("auto:small->large;low_confidence=score:")
    assert usage.completion_tokens == LONG
    deadline = time.monotonic() + 10
    while node_requests(us, SMALL, "disconnected") <= aborted_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node_requests(us, SMALL, "disconnected") == aborted_before + 1
    assert (
        gw.metric(
            "meridian_gateway_auto_escalations_total", tenant="doubter", family=SMALL, reason="low_confidence"
        )
        >= 1
    )
    assert (
        gw.metric(
            "meridian_gateway_auto_wasted_tokens_total", tenant="doubter", family=SMALL, kind="completion"
        )
        >= K
    )

    # Both tiers in the ledger: the large one's answer, the small one's aborted part.
    served, small = ledger_events(ledger_file, headers["x-request-id"], 2)
    assert (served["model"], served["status"], served["completion_tokens"]) == (LARGE, "ok", LONG)
    assert served["route_reason"].startswith("auto:small->large;low_confidence=")
    assert small["request_id"] == headers["x-request-id"] + ":small"
    assert (small["model"], small["status"], small["upstream"]) == (SMALL, "escalated", "us-east-1")
    assert K <= small["completion_tokens"] < LONG and small["prompt_tokens"] > 0 and small["usage_estimated"]
    assert small["cost_usd"] > 0


def test_an_escalated_request_without_a_stream_is_the_large_models_answer(
    gw: RunningGateway, nodes: list[NodeProcess]
) -> None:
    with client(gw, "doubter") as c:
        raw = c.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": PROMPT}], max_tokens=20, **GREEDY
        )
    reply = raw.parse()
    assert raw.headers["x-meridian-route"].startswith("auto:small->large;")
    assert reply.model == LARGE and reply.object == "chat.completion"
    assert reply.choices[0].model_extra["token_ids"] == direct(node(nodes, "us-east-1"), LARGE, 20)
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].logprobs is None
    assert reply.usage.completion_tokens == 20


def test_a_confident_small_model_keeps_the_request(gw: RunningGateway, nodes: list[NodeProcess]) -> None:
    chunks, usage, headers = stream_auto(gw, "truster", max_tokens=24)
    assert [t for ids in chunks for t in ids] == direct(node(nodes, "us-east-1"), SMALL, 24)
    assert headers["x-meridian-route"].startswith("auto:small;")
    assert ";confident=score:" in headers["x-meridian-route"]
    assert usage.completion_tokens == 24


def test_a_confident_answer_without_a_stream_keeps_the_clients_own_logprobs(
    gw: RunningGateway, nodes: list[NodeProcess]
) -> None:
    with client(gw, "truster") as c:
        plain = c.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": PROMPT}], max_tokens=12, **GREEDY
        )
        asked = c.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=12,
            logprobs=True,
            **GREEDY,
        )
    expected = direct(node(nodes, "us-east-1"), SMALL, 12)
    assert plain.model == SMALL and plain.choices[0].model_extra["token_ids"] == expected
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content and plain.usage.completion_tokens == 12
    assert asked.choices[0].logprobs is not None and len(asked.choices[0].logprobs.content) == 12


def test_a_confident_answer_on_messages_names_the_stop_sequence_it_matched(gw: RunningGateway) -> None:
    """The cascade collects the small model's stream: the stop string it matched must survive, as
    /v1/messages answers it (`stop_sequence`), not as an `end_turn` it did not end on."""
    with client(gw, "truster") as c:
        text = (
            c.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": PROMPT}], max_tokens=12, temperature=0
            )
            .choices[0]
            .message.content
        )
    assert text and text.strip(), "the small model's greedy answer has something to stop on"
    start = len(text) - len(text.lstrip())
    stop = text[start : start + 2]
    reply = httpx.post(
        f"{gw.url}/v1/messages",
        headers={"x-api-key": "sk-truster", "anthropic-version": "2023-06-01"},
        json={
            "model": "auto",
            "max_tokens": 12,
            "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}],
            "stop_sequences": [stop],
        },
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert (message["model"], message["stop_reason"], message["stop_sequence"]) == (
        SMALL,
        "stop_sequence",
        stop,
    )
    assert text.startswith(message["content"][0]["text"])


def test_an_eu_tenants_escalation_stays_in_the_eu(
    gw: RunningGateway, nodes: list[NodeProcess], ledger_file: Path
) -> None:
    chunks, _, headers = stream_auto(gw, "doubter-eu", max_tokens=16)
    assert headers["x-meridian-route"].startswith("auto:small->large;")
    assert (headers["x-meridian-region"], headers["x-meridian-model"]) == ("eu-west", LARGE)
    assert [t for ids in chunks for t in ids] == direct(node(nodes, "eu-west-1"), LARGE, 16)
    served, small = ledger_events(ledger_file, headers["x-request-id"], 2)
    assert served["jurisdiction"] == small["jurisdiction"] == "eu"
    assert small["upstream"] == "eu-west-1"


def test_escalation_off_serves_the_starting_tier(nodes: list[NodeProcess], tmp_path: Path) -> None:
    regions = write_regions(tmp_path / "regions.yaml", nodes)
    config = gateway_config(regions, auto={"escalation": {"enabled": False}})
    with run_gateway(config, tenants=TENANTS) as running:
        _, _, headers = stream_auto(running, "doubter", max_tokens=8)
    assert headers["x-meridian-model"] == SMALL
    assert "->large" not in headers["x-meridian-route"]


def test_one_escalation_does_not_start_the_tenants_next_requests_on_the_large_tier(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    # The ratchet: one escalation made the tenant's escalation rate 1.0, and with the classifier's
    # default weight of 1.0 on it, every short prompt after it started large, where nothing was
    # judged, so the rate could not fall until the thrash window ended.
    regions = write_regions(tmp_path / "regions.yaml", nodes)
    config = gateway_config(
        regions,
        auto={
            "escalation": {"k_tokens": K, "window": 3},
            # The doubter's colours are judged and escalate too, each one more verdict: a minimum
            # above all six keeps the answer from hinging on how far their weights have decayed.
            "escalation_rate": {"min_judged": 10},
        },
    )
    with run_gateway(config, tenants=TENANTS) as running, client(running, "doubter") as c:
        first = c.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": PROMPT}], max_tokens=8, **GREEDY
        )
        assert first.headers["x-meridian-route"].startswith("auto:small->large;")
        routes = [
            c.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, **GREEDY
            ).headers["x-meridian-route"]
            for _ in range(5)
        ]
    assert all(route.startswith("auto:small") for route in routes), routes

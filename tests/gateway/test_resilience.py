"""Residency and failover with real nodes being killed: the gateway's hard promises.

One module-scoped fleet — two EU nodes and one US node, every node serving both models — that
tests kill (SIGKILL) and restart. Every request is bounded by a timeout, so a hung stream fails
the test instead of hanging it.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import (
    AUTH,
    EU_KEY,
    GLOBAL_KEY,
    NodeProcess,
    RunningGateway,
    break_stream_midway,
    gateway_over,
    running_fleet,
)

REQUEST_TIMEOUT_S = 45.0


@pytest.fixture(scope="module")
def nodes(
    llama_checkpoint: Path, qwen2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    models = {"meridian-small": (llama_checkpoint, "small"), "meridian-large": (qwen2_checkpoint, "large")}
    placements = [
        ("eu-west-1", "eu-west", "eu"),
        ("eu-west-2", "eu-west", "eu"),
        ("us-east-1", "us-east", "us"),
    ]
    with running_fleet(placements, models, tmp_path_factory.mktemp("node-logs")) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def gw(nodes: list[NodeProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway_over(nodes, tmp_path_factory.mktemp("gw")) as running:
        yield running


@pytest.fixture
def fleet(nodes: list[NodeProcess], gw: RunningGateway) -> list[NodeProcess]:
    """Every node alive and seen healthy by the gateway (restarting those a test killed)."""
    gw.wait_healthy(nodes)
    return nodes


@dataclass
class Outcome:
    status: int
    region: str | None
    stream: bool
    done: bool = False  # a stream ended with [DONE]
    finished: bool = False  # ...after a finish_reason
    error_event: dict[str, Any] | None = None
    body: Any = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""


def call(
    gw: RunningGateway, key: str, *, stream: bool, max_tokens: int = 16, prompt: str = "Hello", **extra: Any
) -> Outcome:
    body = {
        "model": "meridian-small",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
    }
    body |= {"temperature": 0, "stream": stream, **extra}
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=REQUEST_TIMEOUT_S
    ) as response:
        outcome = Outcome(response.status_code, response.headers.get("x-meridian-region"), stream)
        if response.status_code != 200 or not stream:
            outcome.body = json.loads(response.read())
            return outcome
        for line in response.iter_lines():
            read_sse_line(outcome, line)
    return outcome


def read_sse_line(outcome: Outcome, line: str) -> None:
    if not line.startswith("data: "):
        return
    if line == "data: [DONE]":
        outcome.done = True
        return
    event = json.loads(line[6:])
    if "error" in event:
        outcome.error_event = event["error"]
        return
    for choice in event.get("choices", []):
        outcome.text += choice.get("delta", {}).get("content") or ""
        outcome.token_ids += choice.get("token_ids") or []
        outcome.finished = outcome.finished or bool(choice.get("finish_reason"))


def tenant_tokens_on(node: NodeProcess, tenant: str) -> float:
    """Prompt tokens the node itself counted for `tenant` (its own /metrics)."""
    total = 0.0
    for line in node.metrics().splitlines():
        if line.startswith("meridian_node_prompt_tokens_total{") and f'tenant="{tenant}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_eu_tenant_never_routed_to_us_even_when_eu_nodes_die(
    gw: RunningGateway, fleet: list[NodeProcess]
) -> None:
    rng = random.Random(20261122)
    eu_nodes = [n for n in fleet if n.jurisdiction == "eu"]
    us_node = next(n for n in fleet if n.jurisdiction == "us")
    first, second = rng.sample(eu_nodes, 2)
    outcomes: list[Outcome] = []

    # Phase 1: one EU node dies at a random moment while requests are in flight.
    killer = threading.Timer(rng.uniform(0.1, 0.6), first.kill)
    killer.start()
    with ThreadPoolExecutor(4) as pool:
        phase1 = list(
            pool.map(lambda i: call(gw, EU_KEY, stream=i % 2 == 0, max_tokens=rng.randint(8, 48)), range(16))
        )
    killer.join()
    outcomes += phase1
    assert all(o.status == 200 for o in phase1), [(o.status, o.body) for o in phase1]
    assert all(o.finished or o.error_event for o in phase1 if o.stream)

    # Phase 2: every EU node is down. The US node is healthy, and still never used.
    second.kill()
    phase2 = [call(gw, EU_KEY, stream=i % 2 == 0) for i in range(6)]
    outcomes += phase2
    assert all(o.status == 503 for o in phase2), [(o.status, o.body) for o in phase2]
    messages = [o.body["error"]["message"] for o in phase2]
    assert any("jurisdictions eu" in m and "outside the tenant's residency" in m for m in messages), messages

    assert {o.region for o in outcomes if o.status == 200} == {"eu-west"}
    assert all(o.region in (None, "eu-west") for o in outcomes)
    assert tenant_tokens_on(us_node, "t-eu") == 0.0
    assert (
        gw.metric(
            "meridian_gateway_requests_total",
            tenant="t-eu",
            model="meridian-small",
            region="us-east",
            status="200",
        )
        == 0
    )
    assert httpx.get(gw.url + "/health").json()["healthy_nodes"] == 1


def kill_while_busy(node: NodeProcess, deadline_s: float = 60.0) -> None:
    """SIGKILL `node` once its /load reports a request running or waiting, so that the kill hits
    requests in flight however the machine schedules the load (the drill's point); at the
    deadline, killed anyway (the assertion on what it hit then says the load never reached it)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        load = httpx.get(node.url + "/load", headers=AUTH, timeout=10).json()
        if load["num_running"] + load["num_waiting"] > 0:
            break
        time.sleep(0.005)
    node.kill()


def test_failover_drill_kill_one_node_under_mixed_load(gw: RunningGateway, fleet: list[NodeProcess]) -> None:
    rng = random.Random(42)
    # Home region is eu-west, so the EU nodes carry the load: kill one of them.
    victim = rng.choice([n for n in fleet if n.region == "eu-west"])
    completed = 0
    lock = threading.Lock()

    def one(i: int) -> Outcome:
        nonlocal completed
        outcome = call(
            gw, GLOBAL_KEY, stream=i % 2 == 1, max_tokens=rng.randint(16, 64), prompt=f"request {i % 5}"
        )
        with lock:
            completed += 1
            kill = completed == 8
        if kill:  # mid-load, outside the lock so that the other threads keep sending
            kill_while_busy(victim)
        return outcome

    started = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(one, range(36)))
    assert time.monotonic() - started < 120
    assert not victim.alive()

    plain = [o for o in outcomes if not o.stream]
    streams = [o for o in outcomes if o.stream]
    assert all(o.status == 200 and o.body["choices"][0]["message"]["content"] is not None for o in plain), [
        (o.status, o.body) for o in plain if o.status != 200
    ]
    for o in streams:
        assert o.status == 200 and o.done, "every stream ends with [DONE]"
        assert o.finished or o.error_event is not None, "a stream either finishes or says why not"
    assert sum(o.finished for o in streams) >= len(streams) - 2
    # The kill really hit requests in flight, and the gateway absorbed them.
    hit = sum(
        gw.metric(
            "meridian_gateway_upstream_attempts_total",
            target=victim.node_id,
            region="eu-west",
            outcome=outcome,
        )
        for outcome in ("retryable", "broken")
    )
    assert hit >= 1


def test_stream_broken_midway_continues_token_exact_on_another_node(
    gw: RunningGateway, fleet: list[NodeProcess]
) -> None:
    request = {
        "prompt": "Continue this story",
        "max_tokens": 400,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    reference = call(gw, GLOBAL_KEY, stream=True, **request)
    assert reference.finished and len(reference.token_ids) == 400

    continuations = gw.metric("meridian_gateway_failovers_total", kind="continuation")
    body = {
        "model": "meridian-small",
        "messages": [{"role": "user", "content": request["prompt"]}],
        "stream": True,
    }
    body |= {"temperature": 0, "max_tokens": 400, "ignore_eos": True, "return_token_ids": True}
    broken = Outcome(200, None, True)
    for line in break_stream_midway(gw, fleet, body).lines:
        read_sse_line(broken, line)
    assert broken.error_event is None, broken.error_event
    assert gw.metric("meridian_gateway_failovers_total", kind="continuation") == continuations + 1
    assert broken.token_ids == reference.token_ids
    assert broken.text == reference.text
    assert broken.finished and broken.done

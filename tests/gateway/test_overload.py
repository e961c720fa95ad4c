"""Overload with real nodes: the large pool over its target, the small tier taking allow_degrade
tenants, everyone else refused early with 429 `overloaded` + Retry-After, residency intact.

Deterministic saturation: the nodes run one sequence at a time (`--max-num-seqs 1`) and every
large engine is kept busy by several requests sent straight to it, so a request always waits in
each large queue. The small engines get only this test's sequential requests, so nothing waits
there. The interactive target sits between the two estimates (router/overload.py): a large
request waits for the engine's one slot behind several 256-token requests (seconds), a small one
only for its own steps (milliseconds).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.policy import key_digest
from router.types import Residency, TenantPolicy
from tests.gateway.conftest import (
    AUTH,
    NodeProcess,
    RunningGateway,
    gateway_config,
    run_gateway,
    running_fleet,
    write_regions,
)

LARGE, SMALL = "meridian-large", "meridian-small"
HOGS_PER_NODE = 6  # a queue behind each engine even when some hogs are between requests (a loaded CI box)
# Each hog's request is long, so the queue holds seconds of work: on a loaded box the hogs' own
# process can go unscheduled for a while, and with short requests the engine emptied its queue
# meanwhile (a probe then saw it idle, and a large request was admitted: 1 run in a full suite).
HOG_TOKENS = 256
TARGET_S = 0.25


def policy(tenant_id: str, *, degrade: bool, eu: bool) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=tenant_id,
        api_key_hashes=frozenset({key_digest(f"sk-{tenant_id}")}),
        allow_degrade=degrade,
        residency=Residency(jurisdictions=frozenset({"eu"})) if eu else Residency(),
    )


TENANTS = (
    policy("degrade", degrade=True, eu=False),
    policy("degrade-eu", degrade=True, eu=True),
    policy("strict", degrade=False, eu=False),
    policy("strict-eu", degrade=False, eu=True),
)


class OneSeqNode(NodeProcess):
    def command(self) -> list[str]:
        return [*super().command(), "--max-num-seqs", "1"]


@pytest.fixture(scope="module")
def nodes(
    llama_checkpoint: Path, qwen2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    models = {SMALL: (llama_checkpoint, "small"), LARGE: (qwen2_checkpoint, "large")}
    placements = [("eu-west-1", "eu-west", "eu"), ("us-east-1", "us-east", "us")]
    logs = tmp_path_factory.mktemp("node-logs")
    with running_fleet(placements, models, logs, node_type=OneSeqNode) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def gw(nodes: list[NodeProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    regions = write_regions(tmp_path_factory.mktemp("gw") / "regions.yaml", nodes)
    admission = {
        "interactive": {"target_ttft_s": TARGET_S, "queue_deadline_s": 0.3, "max_queue": 4},
        "batch": {"target_ttft_s": 60.0, "queue_deadline_s": 0.3, "max_queue": 4},
    }
    with run_gateway(gateway_config(regions, admission=admission), tenants=TENANTS) as running:
        yield running


@pytest.fixture
def saturated(nodes: list[NodeProcess], gw: RunningGateway) -> Iterator[None]:
    """Every large engine busy with a queue behind it, until the test ends (bounded: 120 s)."""
    stop = threading.Event()
    deadline = time.monotonic() + 120

    def hog(node: NodeProcess) -> None:
        body = {"model": LARGE, "prompt": "overload " * 32, "max_tokens": HOG_TOKENS, "ignore_eos": True}
        with httpx.Client(headers=AUTH, timeout=60) as client:
            while not stop.is_set() and time.monotonic() < deadline:
                client.post(node.url + "/v1/completions", json=body)

    threads = [
        threading.Thread(target=hog, args=(n,), daemon=True) for n in nodes for _ in range(HOGS_PER_NODE)
    ]
    for thread in threads:
        thread.start()
    try:
        # Over the target in a probe round that began after the hogs queued up: a round from
        # before (the previous test's queue, or its drained end) says nothing about this one.
        started, wait_for = time.monotonic() + 0.5, time.monotonic() + 30
        while not (
            probed_since(gw, nodes, started)
            and gw.metric("meridian_gateway_pool_queue_wait_seconds", model=LARGE, tier="interactive")
            > TARGET_S
        ):
            assert time.monotonic() < wait_for, "the large pool never reported a queue"
            time.sleep(0.1)
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=70)


def probed_since(gw: RunningGateway, nodes: list[NodeProcess], since: float) -> bool:
    """Has the gateway read every node's load since `since` (monotonic)?"""
    return all(
        (result := gw.gateway.prober.result(node.node_id)) is not None
        and result.load_at is not None
        and result.load_at > since
        for node in nodes
    )


def chat(gw: RunningGateway, tenant_id: str) -> httpx.Response:
    body = {"model": LARGE, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    headers = {"authorization": f"Bearer sk-{tenant_id}"}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_allow_degrade_tenants_are_served_by_the_small_tier_inside_their_residency(
    nodes: list[NodeProcess], gw: RunningGateway, saturated: None
) -> None:
    for tenant_id in ("degrade", "degrade-eu", "degrade-eu"):
        # The gateway sees a node's load as of its last probe. A probe taken while the previous
        # request held the small engine's one slot says that engine is busy, so (one request at a
        # time, as these nodes run) the next request would wait out that probe and pass its queue
        # deadline. Each request goes after a load read that began after the previous one finished
        # (one that ends over a probe timeout, 0.5 s, later began after it).
        finished, wait_for = time.monotonic() + 0.5, time.monotonic() + 30
        while not probed_since(gw, nodes, finished):
            assert time.monotonic() < wait_for, "no probe round after the previous request"
            time.sleep(0.05)
        response = chat(gw, tenant_id)

        assert response.status_code == 200, response.text
        assert response.json()["model"] == SMALL
        assert response.headers["x-meridian-model"] == SMALL
        assert response.headers["x-meridian-route"].startswith("degraded;")
        if tenant_id == "degrade-eu":
            assert response.headers["x-meridian-region"] == "eu-west"
    assert gw.metric("meridian_gateway_degraded_total", tenant="degrade-eu", tier="interactive") == 2


def test_other_tenants_are_refused_early_with_retry_after(gw: RunningGateway, saturated: None) -> None:
    attempts_before = sum_attempts(gw)

    for tenant_id in ("strict", "strict-eu"):
        response = chat(gw, tenant_id)

        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert (error["code"], error["type"]) == ("overloaded", "rate_limit_error")
        assert int(response.headers["retry-after"]) >= 1
        assert (
            gw.metric("meridian_gateway_shed_total", tenant=tenant_id, tier="interactive", reason="deadline")
            >= 1
        )
    # Shed before any upstream call, and holding no quota: the tenant's usage shows no request.
    assert sum_attempts(gw) == attempts_before
    usage = httpx.get(gw.url + "/v1/quota", headers={"authorization": "Bearer sk-strict"}, timeout=10).json()
    assert (usage["requests"]["used"], usage["tokens"]["used"]) == (0, 0)


def sum_attempts(gw: RunningGateway) -> float:
    total = 0.0
    for family in gw.gateway.metrics.registry.collect():
        if family.name == "meridian_gateway_upstream_attempts":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total

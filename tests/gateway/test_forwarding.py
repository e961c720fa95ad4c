"""Failover before the first byte, with scripted upstreams: how many targets one request may try,
and how each attempt's outcome reaches the target's breaker (nodes: passive ejection)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import RetryConfig
from gateway.errors import to_api_error
from gateway.health import BreakerBoard, BreakerState, ejection
from gateway.metrics import GatewayMetrics
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.errors import UpstreamRejected, UpstreamsExhausted
from gateway.upstreams.failover import Forwarder
from protocol import RateLimitError, ServiceUnavailableError
from router import MAX_ATTEMPTS_BOUND
from router.types import Target


class _FailingUpstream:
    def __init__(self) -> None:
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []

    async def complete(self, endpoint: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        self.calls += 1
        self.bodies.append(body)
        raise UpstreamError("boom", status_code=503)


class _Fleet:
    def __init__(self) -> None:
        self.board = BreakerBoard(ejection(base_s=1.0, max_s=2.0))
        self.upstream = _FailingUpstream()

    def upstream_for(self, target: Target) -> _FailingUpstream:
        return self.upstream


async def test_attempts_never_exceed_the_bound_whatever_the_config_says() -> None:
    fleet = _Fleet()
    retry = RetryConfig(max_attempts=MAX_ATTEMPTS_BOUND + 5, backoff_base_s=0.0, backoff_max_s=0.0)
    forwarder = Forwarder(fleet, GatewayMetrics(), retry=retry, stream_idle_s=1.0)  # type: ignore[arg-type]
    targets = [Target("node", f"n{i}", f"http://n{i}", "eu-west", "eu", "m", "r") for i in range(20)]
    with pytest.raises(UpstreamsExhausted) as info:
        await forwarder.complete(targets, "chat", {}, {})
    assert isinstance(to_api_error(info.value), ServiceUnavailableError)
    assert fleet.upstream.calls == MAX_ATTEMPTS_BOUND


async def test_each_target_is_asked_for_the_model_it_serves_and_the_body_is_left_as_given() -> None:
    """A decision may end with degraded targets serving the small tier: each attempt names its
    target's model, and the caller's body is not changed by any attempt."""
    fleet = _Fleet()
    retry = RetryConfig(max_attempts=3, backoff_base_s=0.0, backoff_max_s=0.0)
    forwarder = Forwarder(fleet, GatewayMetrics(), retry=retry, stream_idle_s=1.0)  # type: ignore[arg-type]
    targets = [
        Target("node", "big", "http://big", "eu-west", "eu", "large-model", "r"),
        Target("node", "small", "http://small", "eu-west", "eu", "small-model", "degraded;r"),
    ]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with pytest.raises(UpstreamsExhausted):
        await forwarder.complete(targets, "chat", body, {})
    assert [b["model"] for b in fleet.upstream.bodies] == ["large-model", "small-model"]
    assert all(b["messages"] == body["messages"] for b in fleet.upstream.bodies)
    assert "model" not in body


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class _Scripted:
    """A node that answers from a script (an error to raise, or None for a good answer), then well."""

    def __init__(self, node_id: str, script: list[UpstreamError | None]) -> None:
        self.node_id = node_id
        self.script = script
        self.calls = 0

    async def complete(self, endpoint: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        self.calls += 1
        error = self.script.pop(0) if self.script else None
        if error is not None:
            raise error
        return {"served_by": self.node_id}


class _ScriptedFleet:
    def __init__(self, clock: Clock, **scripts: list[UpstreamError | None]) -> None:
        self.board = BreakerBoard(ejection(base_s=1.0, max_s=8.0), clock=clock)
        self.nodes = {node_id: _Scripted(node_id, script) for node_id, script in scripts.items()}

    def upstream_for(self, target: Target) -> _Scripted:
        return self.nodes[target.target_id]


NODES = [Target("node", node_id, f"http://{node_id}", "eu-west", "eu", "m", "r") for node_id in ("a", "b")]


def forwarder_over(fleet: _ScriptedFleet) -> Forwarder:
    retry = RetryConfig(max_attempts=3, backoff_base_s=0.0, backoff_max_s=0.0)
    return Forwarder(fleet, GatewayMetrics(), retry=retry, stream_idle_s=1.0)  # type: ignore[arg-type]


async def test_a_failed_node_is_skipped_without_an_attempt_until_its_single_trial_readmits_it() -> None:
    clock = Clock()
    fleet = _ScriptedFleet(clock, a=[UpstreamError("boom", status_code=503)], b=[])
    forwarder = forwarder_over(fleet)
    target, _, attempts = await forwarder.complete(NODES, "chat", {}, {})
    assert (target.target_id, attempts) == ("b", 2)
    assert fleet.board.is_open("a")

    target, _, attempts = await forwarder.complete(NODES, "chat", {}, {})
    assert (target.target_id, attempts) == ("b", 1)  # ejected: skipped, not counted as an attempt
    assert fleet.nodes["a"].calls == 1

    clock.now += 1.0  # base_s: the next request is the trial, and it succeeds
    target, _, attempts = await forwarder.complete(NODES, "chat", {}, {})
    assert (target.target_id, attempts) == ("a", 1)
    assert fleet.board.state("a") is BreakerState.CLOSED


async def test_a_failed_trial_ejects_the_node_for_twice_as_long() -> None:
    clock = Clock()
    boom = UpstreamError("boom", status_code=502)
    fleet = _ScriptedFleet(clock, a=[boom, boom], b=[])
    forwarder = forwarder_over(fleet)
    await forwarder.complete(NODES, "chat", {}, {})
    clock.now += 1.0
    target, _, attempts = await forwarder.complete(NODES, "chat", {}, {})
    assert (target.target_id, attempts) == ("b", 2)  # the trial failed over to b
    assert fleet.board.breaker("a").open_until == clock.now + 2.0


async def test_a_node_at_capacity_is_throttled_for_its_retry_after_not_ejected() -> None:
    clock = Clock()
    busy = UpstreamError("busy", status_code=429, retry_after=3.0)
    fleet = _ScriptedFleet(clock, a=[busy, busy], b=[busy])
    forwarder = forwarder_over(fleet)
    with pytest.raises(UpstreamsExhausted) as info:
        await forwarder.complete(NODES, "chat", {}, {})
    assert isinstance(to_api_error(info.value), RateLimitError)
    assert not fleet.board.available("a") and fleet.board.state("a") is BreakerState.CLOSED
    clock.now += 3.0
    assert fleet.board.available("a")


async def test_a_client_error_from_a_node_keeps_it_in_routing() -> None:
    clock = Clock()
    invalid = UpstreamError("bad request", status_code=400, retryable=False)
    fleet = _ScriptedFleet(clock, a=[invalid], b=[])
    forwarder = forwarder_over(fleet)
    with pytest.raises(UpstreamRejected):
        await forwarder.complete(NODES, "chat", {}, {})
    assert fleet.board.available("a") and fleet.nodes["b"].calls == 0


async def test_a_stream_broken_midway_ejects_its_node() -> None:
    fleet = _ScriptedFleet(Clock(), a=[], b=[])
    forwarder = forwarder_over(fleet)
    target, _, _ = await forwarder.complete(NODES, "chat", {}, {})
    forwarder.record_failure(target, UpstreamError("reset", status_code=502), outcome="broken")
    assert fleet.board.is_open("a")

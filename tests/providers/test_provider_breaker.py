"""Providers behind their breakers, end to end against a fake provider through failover (where
every upstream's outcomes are recorded): open, reject fast, probe, close; 429s honoured without
tripping; metrics on an injected registry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.config import RetryConfig
from gateway.errors import to_api_error
from gateway.health import BreakerBoard, BreakerMetrics, BreakerState, ejection
from gateway.health.probes import NodeProber
from gateway.http import ConnectionPool
from gateway.metrics import GatewayMetrics
from gateway.upstreams.base import Upstream, UpstreamError
from gateway.upstreams.errors import UpstreamRejected, UpstreamsExhausted
from gateway.upstreams.failover import Forwarder, next_chunk
from gateway.upstreams.fleet import Fleet
from gateway.upstreams.providers import build_providers
from protocol import APIError, RateLimitError, ServiceUnavailableError
from protocol.chunk import to_builtins
from router.types import NodeInfo, Target
from tests.providers.conftest import env_for, provider_entry, providers_config
from tests.support.fake_providers import FakeProvider, Fault

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
TARGET = Target("provider", "openai-us", "", "us-east", "US", "tiny", "fallback")


class _NoNodes:
    def snapshot(self) -> tuple[NodeInfo, ...]:
        return ()


def _no_node(node_id: str, url: str) -> Upstream:
    raise AssertionError(f"no node upstream expected, got {node_id}")


@dataclass
class Gateway:
    """The parts of one gateway a provider call goes through."""

    board: BreakerBoard
    fleet: Fleet
    forwarder: Forwarder

    async def call(self) -> dict[str, Any]:
        _, response, _ = await self.forwarder.complete([TARGET], "chat", dict(CHAT), {})
        return to_builtins(response)

    def healthy(self) -> list[bool]:
        return [p.healthy for p in self.fleet.snapshot().providers]


@pytest.fixture
def metrics() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def gw(fake_openai: FakeProvider, metrics: CollectorRegistry) -> AsyncIterator[Gateway]:
    entry = provider_entry(fake_openai, "openai-us")  # min_calls 2, 50%, cool-down 0.3 s
    registry = build_providers(
        providers_config({"endpoints": [entry]}), env=env_for(fake_openai, entry), metrics_registry=metrics
    )
    board = BreakerBoard(ejection(base_s=1, max_s=30), metrics=BreakerMetrics(metrics))
    probe_pool = ConnectionPool(connect_timeout_s=1.0)
    try:
        prober = NodeProber(_NoNodes(), probe_pool, interval_s=1, timeout_s=1, headers={})  # type: ignore[arg-type]
        fleet = Fleet(_NoNodes(), prober, board, registry, _no_node)  # type: ignore[arg-type]
        retry = RetryConfig(max_attempts=1, backoff_base_s=0, backoff_max_s=0)
        forwarder = Forwarder(fleet, GatewayMetrics(), retry=retry, stream_idle_s=5.0)
        yield Gateway(board, fleet, forwarder)
    finally:
        await probe_pool.aclose()
        await registry.aclose()


def state_gauge(metrics: CollectorRegistry, target: str) -> float | None:
    return metrics.get_sample_value("meridian_breaker_state", {"target": target})


def rejections(metrics: CollectorRegistry, reason: str) -> float:
    value = metrics.get_sample_value(
        "meridian_breaker_rejections_total", {"target": "openai-us", "reason": reason}
    )
    return value or 0.0


async def call_fails(
    gw: Gateway, fake: FakeProvider, error: type[APIError] = ServiceUnavailableError
) -> None:
    """The call reached the provider, which failed it."""
    calls = len(fake.requests)
    with pytest.raises((UpstreamsExhausted, UpstreamRejected)) as info:
        await gw.call()
    assert isinstance(to_api_error(info.value), error)
    assert len(fake.requests) == calls + 1


async def call_refused(gw: Gateway, fake: FakeProvider) -> ServiceUnavailableError:
    """The call was refused without contacting the provider."""
    calls = len(fake.requests)
    with pytest.raises(UpstreamsExhausted) as info:
        await gw.call()
    error = to_api_error(info.value)
    assert isinstance(error, ServiceUnavailableError)
    assert "No target" in error.message, error.message
    assert len(fake.requests) == calls
    return error


async def fail_twice(gw: Gateway, fake: FakeProvider) -> None:
    fake.fail_next(Fault(status=500), times=2)
    for _ in range(2):
        await call_fails(gw, fake)


async def test_breaker_opens_after_failures_and_rejects_without_calling(
    gw: Gateway, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    await fail_twice(gw, fake_openai)
    assert gw.board.state("openai-us") is BreakerState.OPEN
    assert state_gauge(metrics, "openai-us") == 2
    started = time.monotonic()
    error = await call_refused(gw, fake_openai)  # rejected fast: the provider never saw it
    assert time.monotonic() - started < 0.05
    assert error.status_code == 503 and error.headers["retry-after"]
    assert rejections(metrics, "open") == 1
    assert gw.healthy() == [False]


async def test_half_open_probe_success_closes(
    gw: Gateway, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    await fail_twice(gw, fake_openai)
    await asyncio.sleep(0.35)
    assert gw.board.state("openai-us") is BreakerState.HALF_OPEN
    assert state_gauge(metrics, "openai-us") == 1
    assert gw.healthy() == [True]
    result = await gw.call()
    assert result["choices"][0]["message"]["content"]
    assert gw.board.state("openai-us") is BreakerState.CLOSED
    assert state_gauge(metrics, "openai-us") == 0


async def test_half_open_probe_failure_reopens(gw: Gateway, fake_openai: FakeProvider) -> None:
    await fail_twice(gw, fake_openai)
    await asyncio.sleep(0.35)
    fake_openai.fail_next(Fault(status=503))
    await call_fails(gw, fake_openai)
    assert gw.board.state("openai-us") is BreakerState.OPEN


async def test_only_one_probe_at_a_time_while_half_open(
    gw: Gateway, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    await fail_twice(gw, fake_openai)
    await asyncio.sleep(0.35)
    fake_openai.fail_next(Fault(first_byte_delay_s=0.3))
    probe = asyncio.create_task(gw.call())
    await asyncio.sleep(0.1)
    assert gw.healthy() == [False]  # routing does not offer it while its one trial runs
    await call_refused(gw, fake_openai)
    assert rejections(metrics, "probing") == 1
    await probe
    assert gw.board.state("openai-us") is BreakerState.CLOSED


async def test_streams_count_too(gw: Gateway, fake_openai: FakeProvider) -> None:
    fake_openai.fail_next(Fault(cut_after=3), times=2)
    for _ in range(2):
        opened = await gw.forwarder.open_stream([TARGET], "chat", {**CHAT, "stream": True}, {})
        with pytest.raises(UpstreamError) as info:
            while await next_chunk(opened.chunks, 5.0) is not None:
                pass
        gw.forwarder.record_failure(opened.target, info.value, outcome="broken")  # as the relay does
        await opened.aclose()
    assert gw.board.state("openai-us") is BreakerState.OPEN


async def test_rate_limits_skip_the_provider_until_retry_after_without_tripping(
    gw: Gateway, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    fake_openai.fail_next(Fault(status=429, retry_after="0.4"), times=3)
    await call_fails(gw, fake_openai, RateLimitError)
    assert gw.healthy() == [False]
    await call_refused(gw, fake_openai)
    assert rejections(metrics, "throttled") == 1
    assert gw.board.state("openai-us") is BreakerState.CLOSED
    await asyncio.sleep(0.45)
    assert gw.healthy() == [True]
    await call_fails(gw, fake_openai, RateLimitError)  # two more 429s: still closed
    await asyncio.sleep(0.45)
    await call_fails(gw, fake_openai, RateLimitError)
    assert gw.board.state("openai-us") is BreakerState.CLOSED
    assert gw.board.breaker("openai-us").window().failures == 0


async def test_client_errors_do_not_trip_the_breaker(gw: Gateway, fake_openai: FakeProvider) -> None:
    fake_openai.fail_next(Fault(status=400), times=4)
    for _ in range(4):
        with pytest.raises(UpstreamRejected):
            await gw.call()
    assert gw.board.state("openai-us") is BreakerState.CLOSED


async def test_metrics_count_latency_and_errors_by_provider_and_kind(
    gw: Gateway, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    await gw.call()
    fake_openai.fail_next(Fault(status=429))
    await call_fails(gw, fake_openai, RateLimitError)
    labels = {"provider": "openai-us", "kind": "openai"}
    assert (
        metrics.get_sample_value("meridian_provider_latency_seconds_count", {**labels, "phase": "total"}) == 1
    )
    assert (
        metrics.get_sample_value("meridian_provider_errors_total", {**labels, "error": "rate_limited"}) == 1
    )

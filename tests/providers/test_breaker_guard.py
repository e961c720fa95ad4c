"""Providers behind their breakers, end to end against a fake provider: open, reject fast, probe,
close; 429s honoured without tripping; metrics on an injected registry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.health import BreakerState, TargetUnavailableError
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.providers import ProviderError, ProviderRegistry, build_providers
from tests.providers.conftest import env_for, provider_entry, providers_config
from tests.support.fake_providers import FakeProvider, Fault

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


@pytest.fixture
def metrics() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def registry(fake_openai: FakeProvider, metrics: CollectorRegistry) -> AsyncIterator[ProviderRegistry]:
    entry = provider_entry(fake_openai, "openai-us")  # min_calls 2, 50%, cool-down 0.3 s
    registry = build_providers(
        providers_config({"endpoints": [entry]}), env=env_for(fake_openai, entry), metrics_registry=metrics
    )
    await registry.start()
    yield registry
    await registry.aclose()


def state_gauge(metrics: CollectorRegistry, target: str) -> float | None:
    return metrics.get_sample_value("meridian_breaker_state", {"target": target})


async def fail_twice(registry: ProviderRegistry, fake: FakeProvider) -> None:
    fake.fail_next(Fault(status=500), times=2)
    for _ in range(2):
        with pytest.raises(ProviderError):
            await registry.upstream("openai-us").complete("chat", CHAT, {})


async def test_breaker_opens_after_failures_and_rejects_without_calling(
    registry: ProviderRegistry, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    await fail_twice(registry, fake_openai)
    assert registry.board.state("openai-us") is BreakerState.OPEN
    assert state_gauge(metrics, "openai-us") == 2
    calls = len(fake_openai.requests)
    started = time.monotonic()
    with pytest.raises(TargetUnavailableError) as info:
        await registry.upstream("openai-us").complete("chat", CHAT, {})
    assert time.monotonic() - started < 0.05
    assert len(fake_openai.requests) == calls  # rejected fast: the provider never saw it
    assert info.value.retryable and info.value.retry_after is not None
    assert [p.healthy for p in registry.snapshot()] == [False]


async def test_half_open_probe_success_closes(
    registry: ProviderRegistry, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    await fail_twice(registry, fake_openai)
    await asyncio.sleep(0.35)
    assert registry.board.state("openai-us") is BreakerState.HALF_OPEN
    assert state_gauge(metrics, "openai-us") == 1
    assert [p.healthy for p in registry.snapshot()] == [True]
    result = await registry.upstream("openai-us").complete("chat", CHAT, {})
    assert result["choices"][0]["message"]["content"]
    assert registry.board.state("openai-us") is BreakerState.CLOSED
    assert state_gauge(metrics, "openai-us") == 0


async def test_half_open_probe_failure_reopens(registry: ProviderRegistry, fake_openai: FakeProvider) -> None:
    await fail_twice(registry, fake_openai)
    await asyncio.sleep(0.35)
    fake_openai.fail_next(Fault(status=503))
    with pytest.raises(ProviderError):
        await registry.upstream("openai-us").complete("chat", CHAT, {})
    assert registry.board.state("openai-us") is BreakerState.OPEN


async def test_only_one_probe_at_a_time_while_half_open(
    registry: ProviderRegistry, fake_openai: FakeProvider
) -> None:
    await fail_twice(registry, fake_openai)
    await asyncio.sleep(0.35)
    fake_openai.fail_next(Fault(first_byte_delay_s=0.3))
    upstream = registry.upstream("openai-us")
    probe = asyncio.create_task(upstream.complete("chat", CHAT, {}))
    await asyncio.sleep(0.1)
    with pytest.raises(TargetUnavailableError) as info:
        await upstream.complete("chat", CHAT, {})
    assert info.value.reason == "probing"
    await probe
    assert registry.board.state("openai-us") is BreakerState.CLOSED


async def test_streams_count_too(registry: ProviderRegistry, fake_openai: FakeProvider) -> None:
    fake_openai.fail_next(Fault(cut_after=3), times=2)
    for _ in range(2):
        with pytest.raises(UpstreamError):
            async with registry.upstream("openai-us").stream("chat", CHAT, {}) as chunks:
                async for _ in chunks:
                    pass
    assert registry.board.state("openai-us") is BreakerState.OPEN


async def test_rate_limits_skip_the_provider_until_retry_after_without_tripping(
    registry: ProviderRegistry, fake_openai: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(status=429, retry_after="0.4"), times=3)
    upstream = registry.upstream("openai-us")
    with pytest.raises(ProviderError):
        await upstream.complete("chat", CHAT, {})
    assert [p.healthy for p in registry.snapshot()] == [False]
    with pytest.raises(TargetUnavailableError) as info:
        await upstream.complete("chat", CHAT, {})
    assert info.value.reason == "throttled"
    assert registry.board.state("openai-us") is BreakerState.CLOSED
    await asyncio.sleep(0.45)
    assert [p.healthy for p in registry.snapshot()] == [True]
    with pytest.raises(ProviderError):  # two more 429s: still closed
        await upstream.complete("chat", CHAT, {})
    await asyncio.sleep(0.45)
    with pytest.raises(ProviderError):
        await upstream.complete("chat", CHAT, {})
    assert registry.board.state("openai-us") is BreakerState.CLOSED
    assert registry.board.breaker("openai-us").window().failures == 0


async def test_client_errors_do_not_trip_the_breaker(
    registry: ProviderRegistry, fake_openai: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(status=400), times=4)
    for _ in range(4):
        with pytest.raises(ProviderError):
            await registry.upstream("openai-us").complete("chat", CHAT, {})
    assert registry.board.state("openai-us") is BreakerState.CLOSED


async def test_metrics_count_latency_and_errors_by_provider_and_kind(
    registry: ProviderRegistry, fake_openai: FakeProvider, metrics: CollectorRegistry
) -> None:
    await registry.upstream("openai-us").complete("chat", CHAT, {})
    fake_openai.fail_next(Fault(status=429))
    with pytest.raises(ProviderError):
        await registry.upstream("openai-us").complete("chat", CHAT, {})
    labels = {"provider": "openai-us", "kind": "openai"}
    assert (
        metrics.get_sample_value("meridian_provider_latency_seconds_count", {**labels, "phase": "total"}) == 1
    )
    assert (
        metrics.get_sample_value("meridian_provider_errors_total", {**labels, "error": "rate_limited"}) == 1
    )

"""Breaker openings shared between gateway replicas through Redis, and Redis trouble tolerated."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from gateway.health import (
    BreakerBoard,
    BreakerConfig,
    BreakerState,
    Outcome,
    Permit,
    RedisBreakerStore,
    TargetUnavailableError,
)
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.providers import build_providers
from tests.providers.conftest import env_for, provider_entry, providers_config
from tests.support.fake_providers import FakeProvider, Fault
from tests.support.processes import free_port

CONFIG = BreakerConfig(min_calls=2, failure_rate=0.5, cooldown_s=2.0)
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


def board_on(client: Redis, target: str, **kwargs: float) -> BreakerBoard:
    board = BreakerBoard(CONFIG, store=RedisBreakerStore(client, timeout_s=0.5), **kwargs)
    board.register(target)
    return board


def fail(board: BreakerBoard, target: str, times: int) -> None:
    for _ in range(times):
        permit = board.try_acquire(target)
        assert isinstance(permit, Permit)
        board.record(target, permit, Outcome.FAILURE)


async def test_breaker_opened_by_one_replica_is_open_for_the_other(redis: Redis) -> None:
    target = f"openai-{uuid.uuid4().hex[:8]}"  # the Redis server is shared by the whole session
    first, second = board_on(redis, target), board_on(redis, target)
    fail(first, target, 2)
    await first.flush()
    assert first.state(target) is BreakerState.OPEN
    assert second.state(target) is BreakerState.CLOSED
    await second.sync()
    assert second.state(target) is BreakerState.OPEN
    assert second.breaker(target).open_until == pytest.approx(first.breaker(target).open_until, abs=1e-3)
    assert not second.available(target)


async def test_background_sync_picks_up_openings(redis: Redis) -> None:
    target = f"anthropic-{uuid.uuid4().hex[:8]}"
    first, second = board_on(redis, target), board_on(redis, target, sync_interval_s=0.05)
    await second.start()
    try:
        fail(first, target, 2)
        await first.flush()
        for _ in range(100):  # up to 2 s
            if second.state(target) is BreakerState.OPEN:
                break
            await asyncio.sleep(0.02)
        assert second.state(target) is BreakerState.OPEN
    finally:
        await second.aclose()


async def test_retry_after_is_shared_too(redis: Redis) -> None:
    target = f"openai-{uuid.uuid4().hex[:8]}"
    first, second = board_on(redis, target), board_on(redis, target)
    permit = first.try_acquire(target)
    assert isinstance(permit, Permit)
    first.record(target, permit, Outcome.RATE_LIMITED, retry_after=5)
    await first.flush()
    await second.sync()
    assert second.state(target) is BreakerState.CLOSED
    assert not second.available(target)


async def test_marks_expire_with_the_opening(redis: Redis) -> None:
    target = f"openai-{uuid.uuid4().hex[:8]}"
    store = RedisBreakerStore(redis)
    await store.publish(target, "open", time.time() + 0.2)
    assert (await store.fetch([target]))[target].open_until is not None
    await asyncio.sleep(0.3)
    assert await store.fetch([target]) == {}


async def test_redis_down_never_blocks_and_local_state_still_works() -> None:
    client = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=5)  # nothing listens
    target = "openai-x"
    board = BreakerBoard(CONFIG, store=RedisBreakerStore(client, timeout_s=0.1))
    try:
        started = time.monotonic()
        fail(board, target, 2)  # the publication fails in the background
        assert board.state(target) is BreakerState.OPEN
        await board.sync()
        await board.flush()
        assert time.monotonic() - started < 1.0
        assert board.state(target) is BreakerState.OPEN
    finally:
        await board.aclose()
        await client.aclose()


async def test_gateway_replicas_share_a_provider_opening_through_redis_url(
    redis_server: str, fake_openai: FakeProvider
) -> None:
    provider_id = f"openai-{uuid.uuid4().hex[:8]}"
    entry = provider_entry(fake_openai, provider_id)
    section = providers_config({"endpoints": [entry], "redis_url": redis_server})
    replicas = [build_providers(section, env=env_for(fake_openai, entry)) for _ in range(2)]
    try:
        fake_openai.fail_next(Fault(status=500), times=2)
        for _ in range(2):
            with pytest.raises(UpstreamError):
                await replicas[0].upstream(provider_id).complete("chat", CHAT, {})
        await replicas[0].board.flush()
        await replicas[1].board.sync()
        assert [p.healthy for p in replicas[1].snapshot()] == [False]
        with pytest.raises(TargetUnavailableError):
            await replicas[1].upstream(provider_id).complete("chat", CHAT, {})
        assert len(fake_openai.requests) == 2
    finally:
        for replica in replicas:
            await replica.aclose()

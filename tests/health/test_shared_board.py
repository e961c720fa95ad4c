"""Breaker openings shared between gateway replicas through Redis, and Redis trouble tolerated:
for providers and nodes alike, from the board up to two gateways."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from redis.asyncio import Redis

from gateway.health import (
    BreakerBoard,
    BreakerConfig,
    BreakerState,
    Cooldown,
    Outcome,
    Permit,
    RedisBreakerStore,
    RollingWindow,
    ejection,
)
from tests.gateway.conftest import GLOBAL_KEY, RunningGateway, gateway_config, run_gateway
from tests.providers.conftest import env_for, provider_entry
from tests.providers.gateway_harness import TENANTS, US_KEY, dead_node
from tests.support.fake_providers import FakeProvider, Fault, running
from tests.support.processes import free_port
from tests.support.threaded_server import serve_in_thread
from tests.support.waiting import wait_for

CONFIG = BreakerConfig(opens=RollingWindow(min_calls=2, failure_rate=0.5), cooldown=Cooldown(2.0))
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


@pytest.fixture
def fake_openai() -> Iterator[FakeProvider]:
    with running(FakeProvider("openai", api_key="sk-openai-test")) as provider:
        yield provider


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


async def test_a_node_ejected_by_one_replica_is_ejected_for_every_replica(redis: Redis) -> None:
    node = f"eu-{uuid.uuid4().hex[:8]}"
    replicas = [
        BreakerBoard(ejection(base_s=5, max_s=30), store=RedisBreakerStore(redis, timeout_s=0.5))
        for _ in range(2)
    ]
    first, second = replicas
    assert second.available(node)  # the second replica's fleet knows the node
    permit = first.try_acquire(node)
    assert isinstance(permit, Permit)
    first.record(node, permit, Outcome.FAILURE)  # one failed request ejects a node
    await first.flush()
    await second.sync()
    assert second.state(node) is BreakerState.OPEN and not second.available(node)
    assert second.breaker(node).open_until == pytest.approx(first.breaker(node).open_until, abs=1e-3)


def failing_node() -> tuple[Any, list[str]]:
    """A node that answers its probes (ready, idle) and fails every completion with a 500."""
    calls: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        status, body = (200, {"status": "ready"}) if path in ("/ready", "/load") else (500, _ERROR)
        if path not in ("/ready", "/load"):
            calls.append(path)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    return app, calls


_ERROR = {"error": {"message": "engine crashed", "type": "server_error", "param": None, "code": None}}


def chat(gateway: RunningGateway, model: str, key: str = GLOBAL_KEY) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=20,
    )


def test_two_gateways_share_a_node_ejection_through_the_quota_redis(
    redis_server: str, tmp_path: Path
) -> None:
    node_id = f"eu-{uuid.uuid4().hex[:8]}"
    app, calls = failing_node()
    with serve_in_thread(app) as port:
        regions = tmp_path / "regions.yaml"
        node = {
            "node_id": node_id,
            "url": f"http://127.0.0.1:{port}",
            "region": "eu-west",
            "jurisdiction": "eu",
            "models": ["meridian-small"],
        }
        regions.write_text(yaml.safe_dump({"nodes": [node]}), encoding="utf-8")
        config = gateway_config(
            regions,
            quota={"redis_url": redis_server, "key_prefix": f"ej{uuid.uuid4().hex[:8]}"},
            ejection={"base_s": 10.0, "max_s": 30.0},
            providers={"sync_interval_s": 0.05},  # no provider: only how often marks are read
        )
        with run_gateway(config) as first, run_gateway(config) as second:
            assert httpx.get(second.url + "/health").json()["healthy_nodes"] == 1
            assert chat(first, "meridian-small").status_code == 503
            assert httpx.get(first.url + "/health").json()["ejected"] == [node_id]
            wait_for(
                lambda: httpx.get(second.url + "/health").json()["ejected"] == [node_id],
                "the second gateway never saw the ejection",
            )
            assert httpx.get(second.url + "/health").json()["healthy_nodes"] == 0
            assert chat(second, "meridian-small").status_code == 503
    assert calls == ["/v1/chat/completions"]  # the second gateway never sent it a request


def test_two_gateways_share_a_provider_opening_through_redis_url(
    redis_server: str, fake_openai: FakeProvider, tmp_path: Path
) -> None:
    provider_id = f"openai-{uuid.uuid4().hex[:8]}"
    entry = provider_entry(fake_openai, provider_id, jurisdiction="us")  # min_calls 2 at 50%
    entry["breaker"]["cooldown_s"] = 30
    nodes = [dead_node("us-1", "us-east", "us")]
    regions = tmp_path / "regions.yaml"
    regions.write_text(yaml.safe_dump({"nodes": nodes}), encoding="utf-8")
    config = gateway_config(
        regions,
        home_region="us-east",
        catalog=[{"name": "tiny", "tier": "small"}],
        providers={"endpoints": [entry], "redis_url": redis_server, "sync_interval_s": 0.05},
    )
    env = env_for(fake_openai, entry)
    with (
        run_gateway(config, tenants=TENANTS, env=env) as first,
        run_gateway(config, tenants=TENANTS, env=env) as second,
    ):
        fake_openai.fail_next(Fault(status=500), times=2)
        for _ in range(2):
            assert chat(first, "tiny", US_KEY).status_code == 503
        wait_for(
            lambda: (
                f'meridian_breaker_state{{target="{provider_id}"}} 2.0'
                in httpx.get(f"{second.admin_url}/metrics").text
            ),
            "the second gateway never saw the opening",
        )
        assert chat(second, "tiny", US_KEY).status_code == 503
    assert len(fake_openai.requests) == 2

"""Blocking queries on /v1/health/service: prompt on change, patient otherwise, safe on resets."""

from __future__ import annotations

import asyncio
import random
import time

from protocol.consul.client import (
    ConsulClient,
    ConsulConfig,
    blocking_wait,
    next_blocking_index,
)
from tests.consul.registrations import node_registration
from tests.consul_api import ConsulStandIn

SERVICE = "meridian-node"


async def test_blocking_query_returns_within_a_second_of_a_change(client: ConsulClient) -> None:
    first = await client.health_service(SERVICE)
    watch = asyncio.create_task(client.health_service(SERVICE, passing=False, index=first.index, wait_s=10))
    await asyncio.sleep(0.3)
    assert not watch.done(), "a blocking query must wait while nothing changes"
    changed_at = time.monotonic()
    await client.register_service(node_registration("eu-1"))
    result = await asyncio.wait_for(watch, 5)
    assert time.monotonic() - changed_at < 1.0
    assert result.index > first.index
    assert [entry.Service.ID for entry in result.entries] == ["eu-1-127.0.0.1:9001"]


async def test_blocking_query_waits_out_its_wait_when_nothing_changes(client: ConsulClient) -> None:
    first = await client.health_service(SERVICE)
    started = time.monotonic()
    result = await client.health_service(SERVICE, index=first.index, wait_s=1.0)
    elapsed = time.monotonic() - started
    # Consul answers at the end of the wait (plus at most wait/16 of jitter on each side).
    assert 0.95 <= elapsed < 1.0 * (1 + 2 / 16) + 1.0
    assert result.index == first.index


async def test_blocking_query_with_a_stale_index_returns_at_once(client: ConsulClient) -> None:
    await client.register_service(node_registration("eu-1"))
    current = await client.health_service(SERVICE, passing=False)
    started = time.monotonic()
    result = await client.health_service(SERVICE, passing=False, index=current.index - 1, wait_s=10)
    assert time.monotonic() - started < 1.0
    assert result.index == current.index


async def test_heartbeats_that_change_nothing_do_not_wake_watchers(client: ConsulClient) -> None:
    registration = node_registration("eu-1")
    await client.register_service(registration)
    assert registration.Check is not None
    await client.update_ttl(registration.Check.CheckID, "pass", "ready")
    before = await client.health_service(SERVICE)
    watch = asyncio.create_task(client.health_service(SERVICE, index=before.index, wait_s=1.0))
    for _ in range(3):
        await client.update_ttl(registration.Check.CheckID, "pass", "ready")
        await asyncio.sleep(0.1)
    assert not watch.done()
    assert (await watch).index == before.index


async def test_an_index_that_goes_backwards_after_a_rebuilt_consul_is_reset(consul: ConsulStandIn) -> None:
    async with ConsulClient(ConsulConfig(address=consul.address("eu"))) as client:
        for i in range(3):
            await client.register_service(node_registration(f"eu-{i}"))
        old = await client.health_service(SERVICE, passing=False)
        consul.restart(keep_state=False)
        # The rebuilt cluster's index is lower, so the old one blocks until the wait ends...
        result = await client.health_service(SERVICE, passing=False, index=old.index, wait_s=0.5)
    assert result.index < old.index
    # ...and the watcher must start over rather than keep waiting on an index that may never come.
    assert next_blocking_index(old.index, result.index) == 0


def test_next_index_resets_when_it_goes_backwards() -> None:
    assert next_blocking_index(10, 3) == 0
    assert next_blocking_index(10, 10) == 10
    assert next_blocking_index(10, 12) == 12


def test_next_index_is_never_below_one_so_the_watch_cannot_busy_loop() -> None:
    assert next_blocking_index(0, 0) == 1


def test_blocking_wait_adds_at_most_a_sixteenth_of_jitter_and_caps_at_ten_minutes() -> None:
    rng = random.Random(7)
    waits = [blocking_wait(32.0, rng) for _ in range(200)]
    assert all(32.0 <= w <= 34.0 for w in waits)
    assert len(set(waits)) > 100, "the jitter spreads concurrent watchers"
    assert blocking_wait(3600.0, rng) == 600.0

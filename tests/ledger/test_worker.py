"""The settlement's stream append and the ledger worker against a real Redis: one round trip,
atomic with the settlement, and at-least-once delivery committed exactly once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.ledger.event import decode_event, encode_event, encode_events
from gateway.ledger.outbox import LocalOutbox
from gateway.ledger.store import AggregateQuery, LedgerStore
from gateway.ledger.store.sqlite import SqliteLedger
from gateway.ledger.streams import RedisStreams
from gateway.ledger.worker import LedgerWorker
from gateway.quota import MemoryQuotaStore, RedisQuotaStore, StoreQuotaGate
from gateway.quota.gate import store_breaker
from gateway.quota.model import QuotaLimits
from router.types import TenantLimits, TenantPolicy
from tests.ledger.conftest import DAY_MS, T0_MS, event
from tests.support.redis_server import RedisServer

LIMITS = TenantLimits(requests_per_minute=10_000, tokens_per_minute=10**9, concurrent_requests=100)


def tenant(tenant_id: str) -> TenantPolicy:
    return TenantPolicy(tenant_id=tenant_id, api_key_hashes=frozenset(), limits=LIMITS)


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"lw{uuid.uuid4().hex[:8]}"


def patient_gate(client: Redis, prefix: str) -> StoreQuotaGate:
    """A Redis gate whose calls never give up on a busy test box: a fallback admission would
    settle locally, and its event would not be in the stream these tests read."""
    store = RedisQuotaStore(client, key_prefix=prefix, timeout_s=5.0, congested_s=10.0)
    return StoreQuotaGate(store, fallback=MemoryQuotaStore(name="local"))


async def totals(store: LedgerStore, tenant_id: str) -> tuple[int, int]:
    rows = await store.aggregate(AggregateQuery("1d", T0_MS - DAY_MS, T0_MS + 2 * DAY_MS, tenant_id))
    return sum(r.requests for r in rows), sum(r.output_tokens for r in rows)


async def settle_events(gate: StoreQuotaGate, tenant_id: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        admission = await gate.admit(tenant(tenant_id), request_id=f"req-{i}", estimated_tokens=50)
        data = encode_event(event(f"{tenant_id}-{i}", tenant_id=tenant_id, completion_tokens=1))
        await gate.settle(admission, actual_tokens=30, event=data)


async def test_settlement_appends_its_event_in_the_same_single_round_trip(redis: Redis, prefix: str) -> None:
    store = RedisQuotaStore(redis, key_prefix=prefix, timeout_s=5.0, congested_s=10.0)
    gate = StoreQuotaGate(store, fallback=MemoryQuotaStore(name="local"), breaker=store_breaker(1.0))
    admission = await gate.admit(tenant("acme"), request_id="r1", estimated_tokens=50)
    before = await redis.info("commandstats")
    sent = event("acme-1", tenant_id="acme")
    await gate.settle(admission, actual_tokens=30, event=encode_event(sent))
    after = await redis.info("commandstats")

    def calls(stats: dict[str, dict[str, int]], name: str) -> int:
        return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))

    assert calls(after, "evalsha") - calls(before, "evalsha") == 1
    assert calls(after, "xadd") - calls(before, "xadd") == 1  # run by the script, not sent
    key = store.keys("acme").usage
    assert key.startswith(f"{prefix}:{{acme}}:")  # the tenant's hash tag: its quota keys' slot
    [(_, fields)] = await redis.xrange(key)
    assert decode_event(fields[b"e"]) == sent
    reading = await store.read("acme")
    assert (reading.tokens_used, reading.concurrent_in_use) == (30, 0)  # settled with it


async def test_a_refused_append_leaves_the_settlement_undone_too(redis: Redis, prefix: str) -> None:
    store = RedisQuotaStore(redis, key_prefix=prefix, timeout_s=5.0, congested_s=10.0)
    outcome = await store.admit("acme", QuotaLimits.from_tenant(LIMITS), 50, "lease-1", 30_000)
    await redis.set(store.keys("acme").usage, "not a stream")  # XADD will fail: WRONGTYPE
    with pytest.raises(Exception, match="WRONGTYPE"):
        await store.settle("acme", outcome.slot, outcome.day, -20, "lease-1", b"{}")
    reading = await store.read("acme")
    assert (reading.tokens_used, reading.concurrent_in_use) == (50, 1)  # nothing applied


async def test_worker_moves_every_tenants_stream_into_the_store(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    gate = StoreQuotaGate(
        RedisQuotaStore(redis, key_prefix=prefix, timeout_s=5.0, congested_s=10.0),
        fallback=MemoryQuotaStore(name="local"),
    )
    await settle_events(gate, "acme", 30)
    await settle_events(gate, "globex", 12)
    store = SqliteLedger(tmp_path / "l.sqlite")
    # Only acme is in the policy set: globex's stream is found by the scan.
    source = RedisStreams(redis, key_prefix=prefix, tenants=lambda: ["acme"], claim_idle_ms=60_000)
    worker = LedgerWorker(source, store, batch_size=7)
    await worker.drain()
    assert await totals(store, "acme") == (30, 30)
    assert await totals(store, "globex") == (12, 12)
    assert await redis.xlen(source.stream_key("acme")) == 0  # acknowledged entries are deleted
    await store.close()


async def test_one_settlement_may_carry_several_events_written_together(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    """An escalated `auto` request settles once with its small tier's event beside its own."""
    gate = patient_gate(redis, prefix)
    admission = await gate.admit(tenant("acme"), request_id="r1", estimated_tokens=50)
    both = [
        event("acme-1", tenant_id="acme", completion_tokens=5),
        event("acme-1:small", tenant_id="acme", completion_tokens=2),
    ]
    await gate.settle(admission, actual_tokens=30, event=encode_events(both))
    await settle_events(gate, "acme", 1, start=2)  # a one-event entry beside it
    store = SqliteLedger(tmp_path / "l.sqlite")
    worker = LedgerWorker(RedisStreams(redis, key_prefix=prefix, tenants=lambda: ["acme"]), store)
    await worker.drain()
    assert await totals(store, "acme") == (3, 8)
    await store.close()


async def test_a_worker_killed_after_commit_before_ack_counts_nothing_twice(
    redis: Redis, prefix: str, tmp_path: Path
) -> None:
    gate = StoreQuotaGate(
        RedisQuotaStore(redis, key_prefix=prefix, timeout_s=5.0, congested_s=10.0),
        fallback=MemoryQuotaStore(name="local"),
    )
    await settle_events(gate, "acme", 20)
    store = SqliteLedger(tmp_path / "l.sqlite")
    dying = RedisStreams(
        redis, key_prefix=prefix, tenants=lambda: ["acme"], consumer="dies", claim_idle_ms=100
    )
    batch = await dying.read(8, 0)
    await store.commit([decode_event(d.data) for d in batch])  # committed ... and the process dies
    assert len(batch) == 8

    heir = RedisStreams(
        redis, key_prefix=prefix, tenants=lambda: ["acme"], consumer="heir", claim_idle_ms=100
    )
    worker = LedgerWorker(heir, store, batch_size=5)
    await asyncio.sleep(0.15)  # the dead consumer's entries are idle past claim_idle_ms
    for _ in range(200):  # bounded: 200 steps of at most ~0.05 s
        if not await worker.step(wait_s=0.05) and worker.stats.read >= 20:
            break
    assert worker.stats.read == 20  # the 8 were delivered again ...
    assert await totals(store, "acme") == (20, 20)  # ... and counted once
    await store.close()


async def test_a_worker_killed_before_commit_loses_nothing(redis: Redis, prefix: str, tmp_path: Path) -> None:
    gate = StoreQuotaGate(
        RedisQuotaStore(redis, key_prefix=prefix, timeout_s=5.0, congested_s=10.0),
        fallback=MemoryQuotaStore(name="local"),
    )
    await settle_events(gate, "acme", 10)
    dying = RedisStreams(
        redis, key_prefix=prefix, tenants=lambda: ["acme"], consumer="dies", claim_idle_ms=100
    )
    assert len(await dying.read(10, 0)) == 10  # read, never committed
    store = SqliteLedger(tmp_path / "l.sqlite")
    heir = RedisStreams(
        redis, key_prefix=prefix, tenants=lambda: ["acme"], consumer="heir", claim_idle_ms=100
    )
    await asyncio.sleep(0.15)
    await LedgerWorker(heir, store).drain()
    assert await totals(store, "acme") == (10, 10)
    await store.close()


class FailingOnce:
    """A store whose first commit fails after writing nothing (the database went away)."""

    def __init__(self, inner: LedgerStore) -> None:
        self.inner = inner
        self.failed = False

    async def commit(self, events):  # type: ignore[no-untyped-def]
        if not self.failed:
            self.failed = True
            raise ConnectionError("database gone")
        return await self.inner.commit(events)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)


async def test_outbox_events_survive_a_failed_commit(tmp_path: Path) -> None:
    outbox = LocalOutbox()
    memory = MemoryQuotaStore(outbox=outbox)
    gate = StoreQuotaGate(memory)
    await settle_events(gate, "acme", 6)
    assert len(outbox) == 6
    store = SqliteLedger(tmp_path / "l.sqlite")
    worker = LedgerWorker(outbox, FailingOnce(store), batch_size=4)  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        await worker.step(wait_s=0)
    assert len(outbox) == 6  # not acknowledged: still there
    await worker.drain()
    assert await totals(store, "acme") == (6, 6) and len(outbox) == 0
    await store.close()


async def test_a_settlement_redis_cannot_take_keeps_its_event_in_the_outbox(tmp_path: Path) -> None:
    with RedisServer() as server:
        client = Redis.from_url(server.url)
        outbox = LocalOutbox()
        gate = StoreQuotaGate(
            RedisQuotaStore(client, key_prefix="lw-down", timeout_s=0.3),
            fallback=MemoryQuotaStore(name="local", outbox=outbox),
            breaker=store_breaker(5.0),
            outbox=outbox,
        )
        admission = await gate.admit(tenant("acme"), request_id="r1", estimated_tokens=50)
        server.stop()
        await gate.settle(admission, actual_tokens=30, event=encode_event(event("acme-1", tenant_id="acme")))
        assert gate.dropped_settlements == 1 and len(outbox) == 1
        # While Redis is down, fail-open admissions settle locally: their events go there too.
        later = await gate.admit(tenant("acme"), request_id="r2", estimated_tokens=50)
        await gate.settle(later, actual_tokens=30, event=encode_event(event("acme-2", tenant_id="acme")))
        assert len(outbox) == 2
        await client.aclose()


async def test_a_stop_request_ends_the_run_even_if_no_cancellation_reaches_it(tmp_path: Path) -> None:
    """SIGTERM sets the stop event as well as cancelling (gateway/ledger/commands.py): a library
    that swallows the cancellation in a read must not keep the worker running."""
    store = SqliteLedger(tmp_path / "ledger.sqlite")
    await store.start()
    outbox = LocalOutbox()
    worker = LedgerWorker(outbox, store, wait_s=0.05)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    outbox.append("acme", encode_event(event("acme-1", tenant_id="acme")))
    for _ in range(3000):  # a busy box: up to 30 s for the worker to commit it
        if worker.stats.committed:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(run, timeout=30)  # ends by itself, no cancel
    assert worker.stats.committed == 1
    await store.close()

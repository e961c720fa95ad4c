"""Quota admission, settlement and the usage streams on a real 3-shard Redis Cluster: every
tenant's keys (its usage stream included) hash to one slot, tenants spread over the shards, the
worker finds every stream by scanning all primaries, and a shard SIGKILLed and restarted mid-run
loses no settled event (AOF, fsync always)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.crc import key_slot

from gateway.ledger.event import encode_event
from gateway.ledger.outbox import LocalOutbox
from gateway.ledger.store.interface import AggregateQuery
from gateway.ledger.store.sqlite import SqliteLedger
from gateway.ledger.streams import RedisStreams
from gateway.ledger.worker import LedgerWorker
from gateway.quota import MemoryQuotaStore, RedisQuotaStore, StoreQuotaGate
from gateway.quota.gate import store_breaker
from gateway.quota.redis_store import connect
from router.types import TenantLimits, TenantPolicy
from tests.ledger.conftest import DAY_MS, T0_MS, event
from tests.support.redis_cluster import RedisCluster

TENANTS = [f"tenant-{i}" for i in range(12)]
LIMITS = TenantLimits(requests_per_minute=100_000, tokens_per_minute=10**9, concurrent_requests=1000)


def policy(tenant_id: str) -> TenantPolicy:
    return TenantPolicy(tenant_id=tenant_id, api_key_hashes=frozenset(), limits=LIMITS, fail_mode="open")


def gate_on(client: Any, outbox: LocalOutbox) -> StoreQuotaGate:
    return StoreQuotaGate(
        RedisQuotaStore(client, key_prefix="mq", timeout_s=3.0, congested_s=6.0),
        fallback=MemoryQuotaStore(name="local", outbox=outbox),
        breaker=store_breaker(0.2),
        outbox=outbox,
    )


async def settle(gate: StoreQuotaGate, tenant_id: str, i: int) -> None:
    admission = await gate.admit(policy(tenant_id), request_id=f"{tenant_id}-{i}", estimated_tokens=20)
    data = encode_event(event(f"{tenant_id}-{i}", tenant_id=tenant_id, completion_tokens=3))
    await gate.settle(admission, actual_tokens=10, event=data)


async def ledger_count(store: SqliteLedger) -> tuple[int, int]:
    rows = await store.aggregate(AggregateQuery("1d", T0_MS - DAY_MS, T0_MS + DAY_MS, None))
    return sum(r.requests for r in rows), sum(r.output_tokens for r in rows)


async def drain(workers: list[LedgerWorker], store: SqliteLedger, expected: int) -> tuple[int, int]:
    for _ in range(300):  # bounded: 300 rounds of at most ~0.05 s plus the reads
        for worker in workers:
            try:
                await worker.step(wait_s=0.01)
            except Exception:  # a shard still rejoining: try again
                await asyncio.sleep(0.05)
        if (await ledger_count(store))[0] >= expected:
            break
    return await ledger_count(store)


def test_admission_settlement_and_streams_on_a_three_shard_cluster(
    redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    async def run() -> None:
        client = connect(redis_cluster.url, timeout_s=2.0, cluster=True)
        assert isinstance(client, ClusterClient)
        outbox = LocalOutbox()
        gate = gate_on(client, outbox)
        await gate.start()  # as the gateway does: scripts loaded, connections open
        for i in range(5):
            await asyncio.gather(*(settle(gate, t, i) for t in TENANTS))
        assert len(outbox) == 0  # every settlement reached the cluster
        store = RedisQuotaStore(client, key_prefix="mq")
        owners = set()
        for tenant_id in TENANTS:
            keys = store.keys(tenant_id)
            assert len({key_slot(k.encode()) for k in (*keys.all(), keys.usage)}) == 1
            owners.add(client.get_node_from_key(keys.usage).port)
            reading = await store.read(tenant_id)
            assert (reading.requests_used, reading.tokens_used, reading.concurrent_in_use) == (5, 50, 0)
        assert len(owners) >= 2  # the tenants really are spread over shards
        ledger = SqliteLedger(tmp_path / "l.sqlite")
        # No tenant list: every stream is found by scanning the primaries.
        worker = LedgerWorker(RedisStreams(client, key_prefix="mq", claim_idle_ms=500), ledger, batch_size=16)
        assert await drain([worker], ledger, 60) == (60, 180)
        await ledger.close()
        await client.aclose()

    asyncio.run(run())


def test_a_shard_restart_mid_run_loses_no_settled_event(redis_cluster: RedisCluster, tmp_path: Path) -> None:
    async def run() -> None:
        client = connect(redis_cluster.url, timeout_s=2.0, cluster=True)
        outbox = LocalOutbox()
        gate = gate_on(client, outbox)
        await gate.start()
        rounds = 30
        for i in range(rounds):
            if i == 10:
                redis_cluster.kill(1)
            if i == 20:
                redis_cluster.restart(1)
            await asyncio.gather(*(settle(gate, t, i) for t in TENANTS))
        settled = rounds * len(TENANTS)
        # Settlements the dead shard could not take kept their events in the outbox.
        assert len(outbox) > 0
        ledger = SqliteLedger(tmp_path / "l.sqlite")
        streams = LedgerWorker(
            RedisStreams(client, key_prefix="mq", tenants=lambda: TENANTS), ledger, batch_size=50
        )
        local = LedgerWorker(outbox, ledger, batch_size=50)
        assert await drain([streams, local], ledger, settled) == (settled, 3 * settled)
        await ledger.close()
        await client.aclose()

    asyncio.run(run())

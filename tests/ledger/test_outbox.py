"""The in-process outbox with its worker: the embedded (`make up`) path."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.ledger.event import encode_event
from gateway.ledger.outbox import LocalOutbox
from gateway.ledger.store.interface import AggregateQuery
from gateway.ledger.store.sqlite import SqliteLedger
from gateway.ledger.worker import LedgerWorker
from tests.ledger.conftest import DAY_MS, T0_MS, event


async def test_a_catch_up_drain_beside_the_running_worker_commits_each_event_once(tmp_path: Path) -> None:
    outbox = LocalOutbox()
    store = SqliteLedger(tmp_path / "l.sqlite")
    worker = LedgerWorker(outbox, store, batch_size=3, wait_s=0.001)
    task = asyncio.create_task(worker.run())
    try:
        for i in range(60):
            outbox.append("acme", encode_event(event(f"r{i}", completion_tokens=1)))
            if i % 7 == 0:
                await worker.drain(timeout_s=2.0)  # what the usage API does before answering
        await worker.drain(timeout_s=5.0)
    finally:
        task.cancel()
        await asyncio.wait([task])
    rows = await store.aggregate(AggregateQuery("1d", T0_MS, T0_MS + DAY_MS, "acme"))
    assert (sum(r.requests for r in rows), len(outbox), worker.stats.read) == (60, 0, 60)
    await store.close()


async def test_a_malformed_event_is_skipped_not_retried_forever(tmp_path: Path) -> None:
    outbox = LocalOutbox()
    outbox.append("acme", b"{not json")
    outbox.append("acme", encode_event(event("good")))
    store = SqliteLedger(tmp_path / "l.sqlite")
    worker = LedgerWorker(outbox, store)
    await worker.drain()
    assert (worker.stats.malformed, worker.stats.committed, len(outbox)) == (1, 1, 0)
    await store.close()

"""The batch store's leases (gateway/batches/store.py), on a real SQLite file: each line is held
by one gateway at a time and gets exactly one answer; a dead holder's lines come back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gateway.batches.input import InputLine
from gateway.batches.records import BatchRecord
from gateway.batches.store import SqliteBatchStore


def _batch(batch_id: str, lines: int, *, expires_in: int = 3600) -> tuple[BatchRecord, list[InputLine]]:
    now = int(time.time())
    record = BatchRecord(
        id=batch_id,
        tenant_id="t",
        api_key_id="k",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        metadata=None,
        callback_url=None,
        status="validating",
        created_at=now,
        expires_at=now + expires_in,
    )
    body = {"model": "m", "messages": []}
    return record, [InputLine(i, f"c{i}", "/v1/chat/completions", body) for i in range(1, lines + 1)]


def test_two_gateways_never_claim_the_same_line(tmp_path: Path) -> None:
    async def scenario() -> None:
        a, b = SqliteBatchStore(tmp_path / "db.sqlite"), SqliteBatchStore(tmp_path / "db.sqlite")
        await a.add_batch(*_batch("batch_1", 20))
        now = time.time()
        first = await a.claim_lines("a", now, 30, 12)
        second = await b.claim_lines("b", now, 30, 12)
        keys_a = {(ln.batch_id, ln.line_no) for ln in first}
        keys_b = {(ln.batch_id, ln.line_no) for ln in second}
        assert len(keys_a) == 12 and len(keys_b) == 8
        assert not keys_a & keys_b
        assert (await a.get_batch("batch_1", None)).status == "in_progress"  # type: ignore[union-attr]
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_a_dead_holders_lines_are_claimed_again_after_the_lease_and_answered_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteBatchStore(tmp_path / "db.sqlite")
        await store.add_batch(*_batch("batch_1", 3))
        now = time.time()
        dead = await store.claim_lines("dead", now, 5, 10)
        assert len(dead) == 3
        assert await store.claim_lines("alive", now + 1, 5, 10) == []  # still leased
        taken = await store.claim_lines("alive", now + 6, 5, 10)
        assert [ln.line_no for ln in taken] == [1, 2, 3]
        # The dead holder's late answer is refused; the new holder's is kept, once.
        assert not await store.finish_line("dead", dead[0], "completed", {"late": True})
        assert await store.finish_line("alive", taken[0], "completed", {"n": 1})
        assert not await store.finish_line("alive", taken[0], "completed", {"n": 2})
        lines = await store.lines("batch_1")
        assert lines[0].status == "completed" and lines[0].result == {"n": 1}
        await store.close()

    asyncio.run(scenario())


def test_a_batch_ends_once_its_lines_are_answered_and_only_one_gateway_ends_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteBatchStore(tmp_path / "db.sqlite")
        await store.add_batch(*_batch("batch_1", 2))
        now = time.time()
        lines = await store.claim_lines("a", now, 30, 10)
        assert await store.claim_finishable("a", now, 30) == []  # lines still pending
        for line in lines:
            await store.finish_line("a", line, "completed", {})
        ready = await store.claim_finishable("a", now, 30)
        assert [(b.id, b.status, ending) for b, ending in ready] == [("batch_1", "finalizing", "completed")]
        assert await store.claim_finishable("b", now, 30) == []  # a holds the batch's lease
        assert not await store.end_batch("b", "batch_1", "completed", int(now), None, None, [])
        assert await store.end_batch("a", "batch_1", "completed", int(now), None, None, [])
        batch = await store.get_batch("batch_1", "t")
        assert batch is not None and batch.status == "completed" and batch.completed == 2
        await store.close()

    asyncio.run(scenario())


def test_a_cancelled_batch_waits_for_its_running_lines_and_runs_no_more(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteBatchStore(tmp_path / "db.sqlite")
        await store.add_batch(*_batch("batch_1", 3))
        now = time.time()
        running = await store.claim_lines("a", now, 30, 1)
        key = ("batch_1", running[0].line_no)
        assert await store.renew("a", [key], now + 30) == []
        assert await store.cancel("batch_1", "t", int(now))
        assert await store.renew("a", [key], now + 30) == [key]  # the runner is told to abort it
        assert await store.claim_lines("a", now, 30, 10) == []
        assert await store.claim_finishable("a", now, 30) == []  # line 1 is still running
        await store.finish_line("a", running[0], "completed", {})
        ready = await store.claim_finishable("a", now, 30)
        assert [ending for _, ending in ready] == ["cancelled"]
        await store.close()

    asyncio.run(scenario())


def test_another_tenant_sees_no_batch(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteBatchStore(tmp_path / "db.sqlite")
        await store.add_batch(*_batch("batch_1", 1))
        assert await store.get_batch("batch_1", "other") is None
        assert not await store.cancel("batch_1", "other", 0)
        assert await store.list_batches("other", limit=10, after=None) == []
        await store.close()

    asyncio.run(scenario())

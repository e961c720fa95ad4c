"""The batch store's contract (gateway/batches/store/), run against a real SQLite file and a real
PostgreSQL alike: each line is held by one gateway at a time and gets exactly one answer; a dead
holder's lines come back; a tenant's enqueued lines are capped atomically; claims are dealt
fairly across tenants; a batch's usage sums its lines'; a tenant's files are listed in pages whose
order does not change under ties."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.batches.input import InputLine
from gateway.batches.records import BatchRecord, FileRecord, LineUsage
from gateway.batches.store import BatchStore, PostgresBatchStore, SqliteBatchStore
from gateway.ledger.store.operation import Reply, Statement

OpenStore = Callable[[], Awaitable[BatchStore]]
NO_LIMIT = 1_000_000
NOTHING = LineUsage(0, 0, 0)


@pytest.fixture(params=["sqlite", "postgres"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens a store on the test's database; each call is another gateway's store on the same one."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    opened: list[BatchStore] = []

    async def open_one() -> BatchStore:
        store: BatchStore = (
            SqliteBatchStore(tmp_path / "db.sqlite") if dsn is None else PostgresBatchStore(dsn, pool_size=2)
        )
        await store.start()
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_store: OpenStore) -> BatchStore:
    return await open_store()


def _batch(
    batch_id: str, lines: int, *, tenant: str = "t", expires_in: int = 3600, callback_url: str | None = None
) -> tuple[BatchRecord, list[InputLine]]:
    now = int(time.time())
    record = BatchRecord(
        id=batch_id,
        tenant_id=tenant,
        api_key_id="k",
        endpoint="/v1/chat/completions",
        input_file_id="file-1",
        completion_window="24h",
        metadata={"n": batch_id},
        callback_url=callback_url,
        status="validating",
        created_at=now,
        expires_at=now + expires_in,
    )
    body = {"model": "m", "messages": []}
    return record, [InputLine(i, f"c{i}", "/v1/chat/completions", body) for i in range(1, lines + 1)]


async def _add(store: BatchStore, batch_id: str, lines: int, **kwargs: object) -> None:
    assert await store.add_batch(*_batch(batch_id, lines, **kwargs), enqueued_limit=NO_LIMIT)  # type: ignore[arg-type]


async def test_lines_come_back_as_they_were_stored(store: BatchStore) -> None:
    """A batch's lines go in packed as one statement (gateway/ledger/store/bulk.py): whatever
    text a custom_id or a body holds comes back to the runner unchanged."""
    record, _ = _batch("batch_1", 0)
    texts = [
        'quote " and \\ backslash',
        "é ☃ 😀 \u2028 \u2029",
        "tab\tnew\nline",
        '{"json": [1]}',
        "x" * 5000,
    ]
    lines = [
        InputLine(
            i, text, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": text}]}
        )
        for i, text in enumerate(texts, start=1)
    ]
    assert await store.add_batch(record, lines, enqueued_limit=NO_LIMIT)
    claimed = await store.claim_lines("a", time.time(), 30, 10)
    assert [(c.line_no, c.custom_id, c.url, c.body) for c in claimed] == [
        (ln.line_no, ln.custom_id, ln.url, ln.body) for ln in lines
    ]


@pytest.mark.parametrize("kind", [SqliteBatchStore, PostgresBatchStore])
def test_a_batchs_lines_go_in_as_one_statement_however_many(kind: type[BatchStore]) -> None:
    """A statement per line (up to 50,000) made SQLite's thread drop and retake the GIL at each,
    against the event loop: driven without a database, a batch of 2,000 lines runs the same
    statements as a batch of 1, none of them per row."""

    def statements(lines: int) -> list[Statement]:
        record, input_lines = _batch("batch_1", lines)
        steps = kind.add_batch.__wrapped__(kind.__new__(kind), record, input_lines, enqueued_limit=NO_LIMIT)  # type: ignore[attr-defined]
        made = [next(steps)]
        try:
            while True:  # the tenant's lock and enqueued count are read first: nothing enqueued
                made.append(steps.send(Reply([(0,)] if made[-1].fetch else [], 1)))
        except StopIteration as done:
            assert done.value is True
        return made

    one, many = statements(1), statements(2_000)
    assert len(one) == len(many)
    assert not any(statement.many for statement in many)


async def test_two_gateways_claiming_at_once_never_take_the_same_line(open_store: OpenStore) -> None:
    a, b = await open_store(), await open_store()
    await _add(a, "batch_1", 20)
    now = time.time()
    first, second = await asyncio.gather(a.claim_lines("a", now, 30, 12), b.claim_lines("b", now, 30, 12))
    keys_a = {(ln.batch_id, ln.line_no) for ln in first}
    keys_b = {(ln.batch_id, ln.line_no) for ln in second}
    assert sorted([len(keys_a), len(keys_b)]) == [8, 12]
    assert not keys_a & keys_b
    assert (await a.get_batch("batch_1", None)).status == "in_progress"  # type: ignore[union-attr]


async def test_a_dead_holders_lines_are_claimed_again_after_the_lease_and_answered_once(
    store: BatchStore,
) -> None:
    await _add(store, "batch_1", 3)
    now = time.time()
    dead = await store.claim_lines("dead", now, 5, 10)
    assert len(dead) == 3
    assert await store.claim_lines("alive", now + 1, 5, 10) == []  # still leased
    taken = await store.claim_lines("alive", now + 6, 5, 10)
    assert [ln.line_no for ln in taken] == [1, 2, 3]
    # The dead holder's late answer is refused; the new holder's is kept, once.
    assert not await store.finish_line("dead", dead[0], "completed", {"late": True}, NOTHING)
    assert await store.finish_line("alive", taken[0], "completed", {"n": 1}, NOTHING)
    assert not await store.finish_line("alive", taken[0], "completed", {"n": 2}, NOTHING)
    lines = await store.lines("batch_1")
    assert lines[0].status == "completed" and lines[0].result == {"n": 1}


async def test_a_batch_ends_once_its_lines_are_answered_and_only_one_gateway_ends_it(
    store: BatchStore,
) -> None:
    await _add(store, "batch_1", 2)
    now = time.time()
    lines = await store.claim_lines("a", now, 30, 10)
    assert await store.claim_finishable("a", now, 30) == []  # lines still pending
    for line in lines:
        await store.finish_line("a", line, "completed", {}, NOTHING)
    ready = await store.claim_finishable("a", now, 30)
    assert [(b.id, b.status, ending) for b, ending in ready] == [("batch_1", "finalizing", "completed")]
    assert await store.claim_finishable("b", now, 30) == []  # a holds the batch's lease
    assert not await store.end_batch("b", "batch_1", "completed", int(now), None, None, [])
    assert await store.end_batch("a", "batch_1", "completed", int(now), None, None, [])
    batch = await store.get_batch("batch_1", "t")
    assert batch is not None and batch.status == "completed" and batch.completed == 2


async def test_a_cancelled_batch_waits_for_its_running_lines_and_runs_no_more(store: BatchStore) -> None:
    await _add(store, "batch_1", 3)
    now = time.time()
    running = await store.claim_lines("a", now, 30, 1)
    key = ("batch_1", running[0].line_no)
    assert await store.renew("a", [key], now + 30) == []
    assert await store.cancel("batch_1", "t", int(now))
    assert await store.renew("a", [key], now + 30) == [key]  # the runner is told to abort it
    assert await store.claim_lines("a", now, 30, 10) == []
    assert await store.claim_finishable("a", now, 30) == []  # line 1 is still running
    await store.finish_line("a", running[0], "completed", {}, NOTHING)
    ready = await store.claim_finishable("a", now, 30)
    assert [ending for _, ending in ready] == ["cancelled"]


async def test_another_tenant_sees_no_batch(store: BatchStore) -> None:
    await _add(store, "batch_1", 1)
    assert await store.get_batch("batch_1", "other") is None
    assert not await store.cancel("batch_1", "other", 0)
    assert await store.list_batches("other", limit=10, after=None) == []


# -- the tenant's enqueued-lines limit -------------------------------------------------------------


async def test_a_batch_over_the_enqueued_limit_is_stored_failed_with_its_errors_and_no_lines(
    store: BatchStore,
) -> None:
    assert await store.add_batch(*_batch("batch_1", 6), enqueued_limit=10)
    record, lines = _batch("batch_2", 5, callback_url="http://127.0.0.1:9/done")
    record.errors = [{"code": "token_limit_exceeded", "message": "too many enqueued lines", "line": None}]
    assert not await store.add_batch(record, lines, enqueued_limit=10)
    failed = await store.get_batch("batch_2", "t")
    assert failed is not None
    assert (failed.status, failed.total, failed.completed, failed.failed) == ("failed", 5, 0, 0)
    assert failed.times["failed_at"] == record.created_at
    assert failed.errors == record.errors and failed.metadata == {"n": "batch_2"}
    assert await store.lines("batch_2") == []
    assert [b.id for b in await store.callbacks_due()] == ["batch_2"]  # it has ended
    assert await store.claim_finishable("a", time.time(), 30) == []  # nothing left to end
    # A batch that fills the limit exactly is accepted; the failed one holds no place in it.
    assert await store.add_batch(*_batch("batch_3", 4), enqueued_limit=10)
    assert len(await store.claim_lines("a", time.time(), 30, 100)) == 10


async def test_answered_lines_and_other_tenants_lines_do_not_count_against_the_limit(
    store: BatchStore,
) -> None:
    assert await store.add_batch(*_batch("batch_1", 8), enqueued_limit=10)
    assert await store.add_batch(*_batch("other_1", 8, tenant="other"), enqueued_limit=10)
    assert not await store.add_batch(*_batch("batch_2", 3), enqueued_limit=10)
    for line in (await store.claim_lines("a", time.time(), 30, 100))[:6]:
        if line.tenant_id == "t":
            assert await store.finish_line("a", line, "completed", {}, NOTHING)
    # Three of batch_1's lines were answered (the claim dealt t and other in turn): 5 enqueued.
    assert await store.add_batch(*_batch("batch_3", 5), enqueued_limit=10)
    assert not await store.add_batch(*_batch("batch_4", 1), enqueued_limit=10)
    # A cancelled batch will run no more of its lines: they free their place.
    assert await store.cancel("batch_1", "t", int(time.time()))
    assert await store.add_batch(*_batch("batch_5", 5), enqueued_limit=10)


async def test_two_creates_at_once_that_together_pass_the_limit_store_exactly_one(
    open_store: OpenStore,
) -> None:
    a, b = await open_store(), await open_store()
    for round_no in range(5):
        tenant = f"tenant{round_no}"
        first, second = (
            _batch(f"batch_{round_no}_a", 6, tenant=tenant),
            _batch(f"batch_{round_no}_b", 6, tenant=tenant),
        )
        accepted = await asyncio.gather(
            a.add_batch(*first, enqueued_limit=10), b.add_batch(*second, enqueued_limit=10)
        )
        assert sorted(accepted) == [False, True]
        batches = await a.list_batches(tenant, limit=10, after=None)
        assert sorted(batch.status for batch in batches) == ["failed", "validating"]
        lines = [len(await a.lines(batch.id)) for batch in batches if batch.status == "validating"]
        assert lines == [6]


# -- usage, listing, fairness ----------------------------------------------------------------------


async def test_a_batchs_usage_is_the_sum_of_its_answered_lines(store: BatchStore) -> None:
    await _add(store, "batch_1", 3)
    now = time.time()
    one, two, three = await store.claim_lines("a", now, 30, 10)
    assert await store.finish_line("a", one, "completed", {}, LineUsage(10, 4, 7))
    assert await store.finish_line("a", two, "failed", {"error": {}}, LineUsage(0, 0, 0))
    assert not await store.finish_line(
        "lost", three, "completed", {}, LineUsage(1000, 0, 1000)
    )  # not its lease
    assert await store.finish_line("a", three, "completed", {}, LineUsage(5, 0, 2))
    batch = await store.get_batch("batch_1", "t")
    assert batch is not None
    assert batch.usage == LineUsage(15, 4, 9)
    assert (batch.completed, batch.failed) == (2, 1)
    [listed] = await store.list_batches("t", limit=10, after=None)
    assert listed.usage == LineUsage(15, 4, 9)


async def test_batches_are_listed_newest_first_in_creation_order_within_the_same_second(
    store: BatchStore,
) -> None:
    # Random ids, all created in the same second: neither the id nor created_at gives the order.
    created = [f"batch_{uuid.uuid4().hex}" for _ in range(30)]
    for batch_id in created:
        record, lines = _batch(batch_id, 1)
        record.created_at = 1_800_000_000
        assert await store.add_batch(record, lines, enqueued_limit=NO_LIMIT)
    pages: list[list[str]] = []
    after = None
    while len(pages) < 10:
        page = [b.id for b in await store.list_batches("t", limit=7, after=after)]
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert [len(p) for p in pages] == [7, 7, 7, 7, 2]
    assert [batch_id for page in pages for batch_id in page] == created[::-1]


async def test_claims_are_dealt_round_robin_across_tenants(store: BatchStore) -> None:
    # Tenant a's huge batch came first; tenant b's small one must not wait behind all of it.
    await _add(store, "batch_a", 50, tenant="a")
    await _add(store, "batch_b", 3, tenant="b")
    await _add(store, "batch_a2", 2, tenant="a")
    now = time.time()
    claimed = await store.claim_lines("g", now, 30, 6)
    assert [(ln.tenant_id, ln.line_no) for ln in claimed] == [
        ("a", 1),
        ("b", 1),
        ("a", 2),
        ("b", 2),
        ("a", 3),
        ("b", 3),
    ]
    # b has nothing left: a's lines follow in its own order (its older batch first).
    more = await store.claim_lines("g", now, 30, 48)
    assert [(ln.batch_id, ln.line_no) for ln in more] == [("batch_a", n) for n in range(4, 51)] + [
        ("batch_a2", 1)
    ]


# -- files -----------------------------------------------------------------------------------------


async def _walk_files(store: BatchStore, *, limit: int, newest_first: bool) -> list[list[str]]:
    """Tenant t's files, page after page, each page `after` the last id of the one before."""
    pages: list[list[str]] = []
    after = None
    while len(pages) < 50:
        records = await store.list_files(
            "t", purpose=None, limit=limit, newest_first=newest_first, after=after
        )
        if not records:
            return pages
        pages.append([f.id for f in records])
        after = pages[-1][-1]
    raise AssertionError("the pages never end")


async def test_files_are_listed_by_creation_time_then_id_in_pages_of_the_tenant_only(
    store: BatchStore,
) -> None:
    # Random ids in two seconds: the id decides within a second, created_at across them.
    files = [
        FileRecord(f"file-{uuid.uuid4().hex}", "t", "f.jsonl", "batch", 1, 1_800_000_000 + i % 2)
        for i in range(13)
    ]
    for record in [*files, FileRecord("file-other", "other", "f.jsonl", "batch", 1, 1_800_000_000)]:
        await store.add_file(record)
    oldest_first = [f.id for f in sorted(files, key=lambda f: (f.created_at, f.id))]
    for newest_first, expected in ((True, oldest_first[::-1]), (False, oldest_first)):
        pages = await _walk_files(store, limit=5, newest_first=newest_first)
        assert [len(p) for p in pages] == [5, 5, 3]
        assert [file_id for page in pages for file_id in page] == expected
    assert [
        f.id for f in await store.list_files("other", purpose=None, limit=10, newest_first=True, after=None)
    ] == ["file-other"]


async def test_deleted_files_are_not_listed_but_still_mark_their_place_and_purpose_filters(
    store: BatchStore,
) -> None:
    for i, purpose in enumerate(["batch", "batch_output", "batch", "batch_output", "batch"]):
        await store.add_file(FileRecord(f"file-{i}", "t", "f.jsonl", purpose, 1, 1_800_000_000 + i))

    async def listed(*, purpose: str | None = None, after: str | None = None) -> list[str]:
        return [
            f.id
            for f in await store.list_files("t", purpose=purpose, limit=10, newest_first=False, after=after)
        ]

    assert await store.delete_file("file-2", "t")
    assert await listed() == ["file-0", "file-1", "file-3", "file-4"]
    # A client deleting each file of a page as it walks goes on after the deleted one.
    assert await listed(after="file-2") == ["file-3", "file-4"]
    assert await listed(purpose="batch_output") == ["file-1", "file-3"]
    assert await listed(purpose="batch", after="file-1") == ["file-4"]
    assert await listed(purpose="fine-tune") == []
    assert await listed(after="file-unknown") == []  # as the batches list answers an unknown id
    await store.add_file(FileRecord("file-theirs", "other", "f.jsonl", "batch", 1, 1_800_000_000))
    assert await listed(after="file-theirs") == []  # another tenant's id is unknown here

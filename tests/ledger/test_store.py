"""The ledger store contract, run against SQLite and a real PostgreSQL alike."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.ledger.event import UsageEvent
from gateway.ledger.store import AggregateQuery, AggregateRow, LedgerStore, PostgresLedger, SqliteLedger
from gateway.ledger.store.operation import Reply, Statement
from tests.ledger.conftest import DAY_MS, T0_MS, event

HOUR_MS = 3_600_000


async def totals(store: LedgerStore, tenant: str | None = "acme") -> tuple[int, int, int, int, float]:
    rows = await store.aggregate(AggregateQuery("1d", T0_MS - 10 * DAY_MS, T0_MS + 10 * DAY_MS, tenant))
    return (
        sum(r.requests for r in rows),
        sum(r.input_tokens for r in rows),
        sum(r.cached_tokens for r in rows),
        sum(r.output_tokens for r in rows),
        round(sum(r.cost_usd for r in rows), 9),
    )


async def test_committing_the_same_events_again_counts_nothing_twice(store: LedgerStore) -> None:
    batch = [event("r1"), event("r2", prompt_tokens=7, cached_tokens=3)]
    assert await store.commit(batch) == 2
    assert await store.commit(batch) == 0
    assert await store.commit([event("r2"), event("r3")]) == 1  # only r3 is new
    assert await totals(store) == (3, 27, 3, 15, 0.003)


async def test_a_batch_repeating_one_request_counts_it_once(store: LedgerStore) -> None:
    assert await store.commit([event("r1"), event("r1")]) == 1
    assert (await totals(store))[0] == 1


async def test_rollups_of_every_width_agree_with_the_raw_events(store: LedgerStore) -> None:
    times = [T0_MS + 5_000, T0_MS + 59_999, T0_MS + 60_000, T0_MS + HOUR_MS + 1, T0_MS + DAY_MS]
    await store.commit([event(f"r{i}", ts_ms=t, completion_tokens=i + 1) for i, t in enumerate(times)])
    span = (T0_MS, T0_MS + 2 * DAY_MS)
    minutes = await store.aggregate(AggregateQuery("1m", *span, "acme"))
    assert [(r.bucket_ms - T0_MS, r.requests) for r in minutes] == [
        (0, 2),
        (60_000, 1),
        (HOUR_MS, 1),
        (DAY_MS, 1),
    ]
    hours = await store.aggregate(AggregateQuery("1h", *span, "acme"))
    assert [(r.bucket_ms - T0_MS, r.output_tokens) for r in hours] == [
        (0, 1 + 2 + 3),
        (HOUR_MS, 4),
        (DAY_MS, 5),
    ]
    days = await store.aggregate(AggregateQuery("1d", *span, "acme"))
    assert [(r.bucket_ms - T0_MS, r.requests) for r in days] == [(0, 4), (DAY_MS, 1)]
    raw = await store.events(*span, "acme", after=None, limit=100)
    assert sum(e.completion_tokens for e in raw) == sum(r.output_tokens for r in days)


async def test_the_range_end_is_exclusive(store: LedgerStore) -> None:
    await store.commit([event("a", ts_ms=T0_MS), event("b", ts_ms=T0_MS + DAY_MS)])
    rows = await store.aggregate(AggregateQuery("1d", T0_MS, T0_MS + DAY_MS, "acme"))
    assert [r.requests for r in rows] == [1]


async def test_grouping_splits_by_each_dimension(store: LedgerStore) -> None:
    await store.commit(
        [
            event("a", model="m1", region="eu-west"),
            event("b", model="m1", region="us-east"),
            event("c", model="m2", region="us-east", api_key_id="key_bbbbbbbbbbbb"),
            event("d", tenant_id="other", model="m2"),
        ]
    )
    span = (T0_MS, T0_MS + DAY_MS)
    by_model = await store.aggregate(AggregateQuery("1d", *span, "acme", ("model",)))
    assert [(r.group, r.requests) for r in by_model] == [((("model", "m1"),), 2), ((("model", "m2"),), 1)]
    by_both = await store.aggregate(AggregateQuery("1d", *span, "acme", ("model", "region")))
    assert len(by_both) == 3
    by_key = await store.aggregate(AggregateQuery("1d", *span, "acme", ("api_key_id",)))
    assert sorted(r.requests for r in by_key) == [1, 2]
    everyone = await store.aggregate(AggregateQuery("1d", *span, None, ("tenant_id",)))
    assert [(dict(r.group)["tenant_id"], r.requests) for r in everyone] == [("acme", 3), ("other", 1)]


async def test_a_request_nothing_served_is_counted_under_its_requested_model(store: LedgerStore) -> None:
    await store.commit(
        [event("x", model="-", model_requested="meridian-large", status="failed", prompt_tokens=0)]
    )
    rows = await store.aggregate(AggregateQuery("1d", T0_MS, T0_MS + DAY_MS, "acme", ("model",)))
    assert [(r.group, r.requests) for r in rows] == [((("model", "meridian-large"),), 1)]


async def test_raw_events_come_back_whole_in_pages(store: LedgerStore) -> None:
    originals = [
        event(
            f"r{i:02d}",
            ts_ms=T0_MS + i // 2,
            stream=True,
            degraded=i % 3 == 0,
            ttft_ms=12.5,
            queue_wait_ms=None,
            safety=True,
        )
        for i in range(25)
    ]
    await store.commit(originals)
    got, after = [], None
    for _ in range(10):
        page = await store.events(T0_MS, T0_MS + DAY_MS, "acme", after=after, limit=10)
        if not page:
            break
        got += page
        after = (page[-1].ts_ms, page[-1].request_id)
    assert got == sorted(originals, key=lambda e: (e.ts_ms, e.request_id))


async def test_purge_drops_old_raw_events_and_minutes_but_keeps_hours_and_days(store: LedgerStore) -> None:
    await store.commit([event("old", ts_ms=T0_MS), event("new", ts_ms=T0_MS + 3 * DAY_MS)])
    assert await store.purge(T0_MS + DAY_MS) > 0
    raw = await store.events(T0_MS - DAY_MS, T0_MS + 5 * DAY_MS, None, after=None, limit=10)
    assert [e.request_id for e in raw] == ["new"]
    minutes = await store.aggregate(AggregateQuery("1m", T0_MS, T0_MS + 5 * DAY_MS, "acme"))
    assert [r.bucket_ms for r in minutes] == [T0_MS + 3 * DAY_MS]
    assert (await totals(store))[0] == 2  # the day rollups still hold both


async def test_concurrent_commits_of_overlapping_batches_count_each_request_once(store: LedgerStore) -> None:
    batches = [[event(f"r{j}", completion_tokens=1) for j in range(i, i + 40)] for i in range(0, 100, 20)]
    results = await asyncio.gather(*(store.commit(b) for b in batches))
    assert sum(results) == 120
    assert (await totals(store))[3] == 120


@pytest.mark.parametrize("count", [1, 1000])
async def test_batches_of_any_size_commit(store: LedgerStore, count: int) -> None:
    assert await store.commit([event(f"r{i}") for i in range(count)]) == count
    assert (await totals(store))[0] == count


def statements_of_a_commit(store: type[LedgerStore], events: list[UsageEvent]) -> list[Statement]:
    """The statements a commit of `events` runs, every event new (driven without a database)."""
    steps = store._commit.__wrapped__(store.__new__(store), events)  # type: ignore[attr-defined]
    ids = [(e.request_id,) for e in events]
    statements = [next(steps)]
    try:
        while True:
            # What an insert that returns ids returns: all of them; what `stored` finds: none.
            rows = ids if statements[-1].sql == store.batch.insert_events else []
            statements.append(steps.send(Reply(rows, len(rows))))
    except StopIteration as done:
        assert done.value == len(events)
    return statements


@pytest.mark.parametrize("store", [SqliteLedger, PostgresLedger])
def test_a_batch_is_committed_in_the_same_few_statements_whatever_its_size(store: type[LedgerStore]) -> None:
    """A statement per event made SQLite's thread drop and retake the GIL hundreds of times per
    batch, against the event loop (gateway/ledger/store/operations.py:BatchStatements)."""
    one = statements_of_a_commit(store, [event("r0")])
    many = statements_of_a_commit(store, [event(f"r{i}", ts_ms=T0_MS + i * 61_000) for i in range(500)])
    assert len(many) == len(one) <= 3
    assert all(not statement.many for statement in many)


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
_COUNT = st.integers(0, 2**40)  # a batch's sums stay within SQLite's 64-bit integers
_EVENTS = st.lists(
    st.builds(
        UsageEvent,
        request_id=st.uuids().map(str),
        ts_ms=st.integers(T0_MS, T0_MS + 3 * DAY_MS),
        tenant_id=_TEXT,
        api_key_id=_TEXT,
        model_requested=_TEXT,
        model=_TEXT,
        tier=_TEXT,
        region=_TEXT,
        jurisdiction=_TEXT,
        upstream=_TEXT,
        route_reason=_TEXT,
        status=_TEXT,
        stream=st.booleans(),
        prompt_tokens=_COUNT,
        cached_tokens=_COUNT,
        completion_tokens=_COUNT,
        usage_estimated=st.booleans(),
        cost_usd=_FLOAT,
        price_version=_TEXT,
        total_ms=_FLOAT,
        gateway_overhead_ms=st.none() | _FLOAT,
        ttft_ms=st.none() | _FLOAT,
        queue_wait_ms=st.none() | _FLOAT,
        prefill_ms=st.none() | _FLOAT,
        decode_ms=st.none() | _FLOAT,
        retries=st.integers(0, 2**31 - 1),
        continuations=st.integers(0, 2**31 - 1),
        degraded=st.booleans(),
        safety=st.booleans(),
        model_version=_TEXT,
    ),
    min_size=1,
    max_size=20,
    unique_by=lambda e: e.request_id,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=_EVENTS)
def test_sqlite_stores_every_field_of_an_event_as_it_was_sent(
    tmp_path: Path, events: list[UsageEvent]
) -> None:
    """The SQLite store packs a batch into one JSON text that SQLite unpacks: whatever an event
    holds (any text but NUL, which no name the gateway writes contains; any finite float; any
    count) comes back equal, and a second commit of the batch finds every event stored."""
    path = tmp_path / f"ledger-{next(_DATABASES)}.sqlite"

    async def round_trip() -> tuple[int, int, list[UsageEvent], list[AggregateRow]]:
        store = SqliteLedger(path)
        try:
            first = await store.commit(events)
            again = await store.commit(events)
            stored = await store.events(T0_MS, T0_MS + 4 * DAY_MS, None, after=None, limit=100)
            days = await store.aggregate(AggregateQuery("1d", T0_MS, T0_MS + 4 * DAY_MS, None))
            return first, again, stored, days
        finally:
            await store.close()

    first, again, stored, days = asyncio.run(round_trip())
    assert (first, again) == (len(events), 0)
    assert stored == sorted(events, key=lambda e: (e.ts_ms, e.request_id))
    assert sum(r.requests for r in days) == len(events)
    assert sum(r.input_tokens for r in days) == sum(e.prompt_tokens for e in events)
    assert sum(r.output_tokens for r in days) == sum(e.completion_tokens for e in events)


_DATABASES = itertools.count()


async def test_an_unreachable_postgres_is_ledger_unavailable(tmp_path: Path) -> None:
    from gateway.ledger.errors import LedgerUnavailable
    from gateway.ledger.store.postgres import PostgresLedger

    store = PostgresLedger(f"postgresql://postgres@/postgres?host={tmp_path}", timeout_s=2)
    with pytest.raises(LedgerUnavailable):
        await store.commit([event("r1")])
    await store.close()


async def test_a_postgres_store_started_late_creates_its_tables_on_first_use(postgres_dsn: str) -> None:
    from gateway.ledger.store.postgres import PostgresLedger

    store = PostgresLedger(postgres_dsn)  # start() never called: the first commit sets up
    assert await store.commit([event("r1")]) == 1
    await store.close()


_OLD_ROW = (
    "INSERT INTO usage_events (request_id, ts_ms, tenant_id, api_key_id, model_requested, model, tier,"
    " region, jurisdiction, upstream, route_reason, status, stream, prompt_tokens, cached_tokens,"
    " completion_tokens, usage_estimated, cost_usd, price_version, total_ms, retries, continuations,"
    " degraded, safety) VALUES ('old', %s, 'acme', 'k', 'm', 'm', 'interactive', 'eu-west', 'eu', 'n',"
    " '-', 'ok', false, 1, 0, 1, false, 0, 'test', 1, 0, 0, false, false)"
)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_database_from_before_model_versions_gets_the_column(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A usage_events table made by the first schema (no model_version) is upgraded in place: its
    rows read back unversioned and new events keep their version."""
    from gateway.ledger.store import sql
    from gateway.ledger.store.postgres import PostgresLedger
    from gateway.ledger.store.sqlite import SqliteLedger

    store: LedgerStore
    if kind == "sqlite":
        import sqlite3

        path = tmp_path / "old.sqlite"
        with sqlite3.connect(path) as db:
            for statement in sql.SCHEMA:
                db.execute(statement)
            db.execute(_OLD_ROW.replace("%s", "?").replace("false", "0"), (T0_MS,))
        store = SqliteLedger(path)
    else:
        import psycopg

        dsn = request.getfixturevalue("postgres_dsn")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for statement in sql.SCHEMA:
                await conn.execute(statement)
            await conn.execute(_OLD_ROW, (T0_MS,))
        store = PostgresLedger(dsn, pool_size=1)
    await store.start()
    try:
        assert await store.commit([event("new", model_version="v2")]) == 1
        got = await store.events(T0_MS, T0_MS + DAY_MS, "acme", after=None, limit=10)
        assert {e.request_id: e.model_version for e in got} == {"new": "v2", "old": ""}
    finally:
        await store.close()

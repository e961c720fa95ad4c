"""The production ledger store: PostgreSQL through psycopg 3 (async).

A batch is two statements in one transaction: the events inserted from arrays (`unnest`, one round
trip however many) with ON CONFLICT DO NOTHING RETURNING the request ids that were new, then the
rollup deltas of exactly those rows upserted. A redelivered event is therefore neither stored nor
counted twice, and a crash between the two statements rolls back both.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.event import UsageEvent
from gateway.ledger.store import sql
from gateway.ledger.store.interface import AggregateQuery, AggregateRow
from gateway.ledger.store.pool import PostgresPool

_PG_TYPES = {
    "request_id": "text", "ts_ms": "bigint", "tenant_id": "text", "api_key_id": "text",
    "model_requested": "text", "model": "text", "tier": "text", "region": "text",
    "jurisdiction": "text", "upstream": "text", "route_reason": "text", "status": "text",
    "stream": "boolean", "prompt_tokens": "bigint", "cached_tokens": "bigint",
    "completion_tokens": "bigint", "usage_estimated": "boolean", "cost_usd": "double precision",
    "price_version": "text", "total_ms": "double precision",
    "gateway_overhead_ms": "double precision", "ttft_ms": "double precision",
    "queue_wait_ms": "double precision", "prefill_ms": "double precision",
    "decode_ms": "double precision", "retries": "integer", "continuations": "integer",
    "degraded": "boolean", "safety": "boolean", "model_version": "text",
}  # fmt: skip
_ROLLUP_TYPES = (
    "text", "bigint", "text", "text", "text", "text",
    "bigint", "bigint", "bigint", "bigint", "double precision",
)  # fmt: skip

INSERT_EVENTS = (
    f"INSERT INTO usage_events ({', '.join(sql.EVENT_COLUMNS)}) SELECT * FROM unnest("
    + ", ".join(f"%s::{_PG_TYPES[c]}[]" for c in sql.EVENT_COLUMNS)
    + ") ON CONFLICT (request_id) DO NOTHING RETURNING request_id"
)
UPSERT_ROLLUPS = (
    f"INSERT INTO usage_rollups ({', '.join(sql.ROLLUP_COLUMNS)}) SELECT * FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in _ROLLUP_TYPES)
    + sql.UPSERT_ROLLUP[sql.UPSERT_ROLLUP.index(") ON CONFLICT") :].replace("VALUES", "")
)


def _columns(rows: Sequence[Sequence[object]], width: int) -> list[list[object]]:
    return [[row[i] for row in rows] for i in range(width)]


class PostgresLedger:
    name = "postgres"

    def __init__(self, dsn: str, *, pool_size: int = 4, timeout_s: float = 5.0) -> None:
        self._pool = PostgresPool(
            dsn,
            size=pool_size,
            timeout_s=timeout_s,
            schema=(
                *sql.SCHEMA,
                *(f"ALTER TABLE usage_events ADD COLUMN IF NOT EXISTS {c} {k}" for c, k in sql.ADDED_COLUMNS),
            ),
            unavailable=LedgerUnavailable,
        )

    async def start(self) -> None:
        async with self._pool.connection():
            pass  # opening the pool creates the schema

    async def commit(self, events: Sequence[UsageEvent]) -> int:
        unique = sql.unique_by_request(events)
        if not unique:
            return 0
        rows = [sql.event_row(e) for e in unique]
        async with self._pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(INSERT_EVENTS, _columns(rows, len(sql.EVENT_COLUMNS)))
            inserted = {r[0] for r in await cursor.fetchall()}
            new = [e for e in unique if e.request_id in inserted]
            if new:
                deltas = sql.rollup_rows(new)
                await conn.execute(UPSERT_ROLLUPS, _columns(deltas, len(sql.ROLLUP_COLUMNS)))
        return len(new)

    async def aggregate(self, query: AggregateQuery) -> list[AggregateRow]:
        statement, params = sql.aggregate_sql(query)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(statement, params)
            rows = await cursor.fetchall()
        return sql.aggregate_rows(query, rows)

    async def events(
        self, start_ms: int, end_ms: int, tenant_id: str | None, *, after: tuple[int, str] | None, limit: int
    ) -> list[UsageEvent]:
        statement, params = sql.events_sql(start_ms, end_ms, tenant_id, after, limit)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(statement, params)
            rows = await cursor.fetchall()
        return [sql.row_event(row) for row in rows]

    async def purge(self, before_ms: int) -> int:
        deleted = 0
        async with self._pool.connection() as conn, conn.transaction():
            for statement in sql.PURGE:
                cursor = await conn.execute(statement, (before_ms,))
                deleted += cursor.rowcount
        return deleted

    async def close(self) -> None:
        await self._pool.close()

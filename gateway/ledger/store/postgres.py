"""The production ledger store: PostgreSQL through psycopg 3 (async), running the operations of
gateway/ledger/store/operations.py.

A batch is two statements in one transaction: the events inserted from arrays (`unnest`, one round
trip however many) with ON CONFLICT DO NOTHING RETURNING the request ids that were new, then the
rollup deltas of exactly those rows upserted. A redelivered event is therefore neither stored nor
counted twice, and a crash between the two statements rolls back both.
"""

from __future__ import annotations

from typing import TypeVar

from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.store import sql
from gateway.ledger.store.operation import Operation
from gateway.ledger.store.operations import BatchStatements, LedgerStore, columns
from gateway.ledger.store.pool import PostgresPool

T = TypeVar("T")

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
    + ") "
    + sql.ROLLUP_CONFLICT
)


class PostgresLedger(LedgerStore):
    name = "postgres"
    batch = BatchStatements(insert_events=INSERT_EVENTS, upsert_rollups=UPSERT_ROLLUPS, pack=columns)

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

    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T:
        return await self._pool.run_operation(operation, transaction=transaction)

    async def start(self) -> None:
        async with self._pool.connection():
            pass  # opening the pool creates the schema

    async def close(self) -> None:
        await self._pool.close()

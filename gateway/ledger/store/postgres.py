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
from gateway.ledger.store.bulk import POSTGRES
from gateway.ledger.store.operation import Operation
from gateway.ledger.store.operations import BatchStatements, LedgerStore
from gateway.ledger.store.pool import PostgresPool

T = TypeVar("T")


class PostgresLedger(LedgerStore):
    name = "postgres"
    batch = BatchStatements.on(POSTGRES, returning=True)

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

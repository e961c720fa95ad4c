"""The embedded batch store: the ledger's SQLite file, its own tables (gateway/batches/store/
operations.py says what they hold and how leases work).

One connection, used by one thread at a time (a lock; calls run in asyncio's thread pool), as
the ledger's SQLite store does; several gateway processes share the file through WAL, and a
write transaction (BEGIN IMMEDIATE) holds the whole database, so a claim, or a count of a
tenant's enqueued lines and the insert that follows it, is never interleaved with another's.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TypeVar

from gateway.batches.errors import BatchStoreUnavailable
from gateway.batches.store.operations import BatchStore
from gateway.batches.store.sql import Dialect, schema
from gateway.ledger.store.bulk import SQLITE, require_sqlite_json
from gateway.ledger.store.operation import Operation
from gateway.ledger.store.sqlite_file import SqliteFile

T = TypeVar("T")

DIALECT = Dialect(
    bulk=SQLITE,
    seq_column="seq INTEGER NOT NULL UNIQUE",
    next_seq="(SELECT COALESCE(MAX(seq), 0) + 1 FROM batches)",  # inside the write transaction
    lock_rows="",  # the write transaction already excludes every other writer
    tenant_lock=None,
)


class SqliteBatchStore(BatchStore):
    name = "sqlite"
    dialect = DIALECT

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self._file = SqliteFile(
            path, prepare=_prepare, unavailable=BatchStoreUnavailable, busy_timeout_s=busy_timeout_s
        )
        self.path = self._file.path

    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T:
        return await self._file.run_operation(operation, transaction=transaction)

    async def start(self) -> None:
        await self._file.run(lambda db: None)  # opening the connection creates the tables

    async def close(self) -> None:
        await self._file.close()


def _prepare(db: sqlite3.Connection) -> None:
    require_sqlite_json(db)
    for statement in schema(DIALECT):
        db.execute(statement)

"""The embedded batch store: the ledger's SQLite file, its own tables (gateway/batches/store/
operations.py says what they hold and how leases work).

One connection, used by one thread at a time (a lock; calls run in asyncio's thread pool), as
the ledger's SQLite store does; several gateway processes share the file through WAL, and a
write transaction (BEGIN IMMEDIATE) holds the whole database, so a claim, or a count of a
tenant's enqueued lines and the insert that follows it, is never interleaved with another's.
"""

from __future__ import annotations

import sqlite3
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

from gateway.batches.errors import BatchStoreUnavailable
from gateway.batches.store.operations import Operation, Reply, SqlBatchStore
from gateway.batches.store.sql import Dialect, schema
from gateway.ledger.store.sqlite_file import SqliteFile, write_transaction

T = TypeVar("T")

DIALECT = Dialect(
    seq_column="seq INTEGER NOT NULL UNIQUE",
    next_seq="(SELECT COALESCE(MAX(seq), 0) + 1 FROM batches)",  # inside the write transaction
    lock_rows="",  # the write transaction already excludes every other writer
    tenant_lock=None,
)


class SqliteBatchStore(SqlBatchStore):
    name = "sqlite"
    dialect = DIALECT

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self._file = SqliteFile(
            path, prepare=_prepare, unavailable=BatchStoreUnavailable, busy_timeout_s=busy_timeout_s
        )
        self.path = self._file.path

    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T:
        return await self._file.run(lambda db: _drive(db, operation, transaction))

    async def start(self) -> None:
        await self._run(_nothing())

    async def close(self) -> None:
        await self._file.close()


def _prepare(db: sqlite3.Connection) -> None:
    for statement in schema(DIALECT):
        db.execute(statement)


def _nothing() -> Operation[None]:
    return
    yield  # a generator that runs no statement: opening the connection creates the tables


def _drive(db: sqlite3.Connection, operation: Operation[T], transaction: bool) -> T:
    with write_transaction(db) if transaction else nullcontext():
        try:
            statement = next(operation)
            while True:
                query = statement.sql.replace("%s", "?")
                cursor: Any = (
                    db.executemany(query, statement.params)
                    if statement.many
                    else db.execute(query, statement.params)
                )
                rows = cursor.fetchall() if statement.fetch else []
                statement = operation.send(Reply(rows, cursor.rowcount))
        except StopIteration as done:
            return done.value

"""The embedded batch store: the ledger's SQLite file, its own tables (gateway/batches/store/
operations.py says what they hold and how leases work).

One connection, used by one thread at a time (a lock; calls run in asyncio's thread pool), as
the ledger's SQLite store does; several gateway processes share the file through WAL, and a
write transaction (BEGIN IMMEDIATE) holds the whole database, so a claim, or a count of a
tenant's enqueued lines and the insert that follows it, is never interleaved with another's.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

from gateway.batches.errors import BatchStoreUnavailable
from gateway.batches.store.operations import Operation, Reply, SqlBatchStore
from gateway.batches.store.sql import Dialect, schema

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
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T:
        def locked() -> T:
            with self._lock:
                if self._db is None:
                    self._db = self._open()
                try:
                    return _drive(self._db, operation, transaction)
                except sqlite3.Error as exc:
                    raise BatchStoreUnavailable(f"sqlite {self.path}: {exc}") from exc

        return await asyncio.to_thread(locked)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        for statement in schema(DIALECT):
            db.execute(statement)
        return db

    async def start(self) -> None:
        await self._run(_nothing())

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None

        await asyncio.to_thread(close)


def _nothing() -> Operation[None]:
    return
    yield  # a generator that runs no statement: opening the connection creates the tables


def _drive(db: sqlite3.Connection, operation: Operation[T], transaction: bool) -> T:
    with _transaction(db) if transaction else nullcontext():
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


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")

"""One SQLite file as the ledger's stores use it (the usage ledger and the batch tables beside it).

One connection, used by one thread at a time (a lock; calls run in asyncio's default thread
pool), opened on first use so a file that was unwritable at start-up is retried. WAL lets readers
run while a writer commits, and several gateway processes (`--workers`) may share the file:
writers wait up to busy_timeout. `synchronous=FULL`: a committed transaction survives a power cut
(the ledger acknowledges its Redis stream entries only after that).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypeVar

from gateway.ledger.store.operation import Operation, Reply

T = TypeVar("T")


class SqliteFile:
    def __init__(
        self,
        path: str | Path,
        *,
        prepare: Callable[[sqlite3.Connection], None],
        unavailable: Callable[[str], Exception],
        busy_timeout_s: float = 10.0,
    ) -> None:
        """`prepare` creates (or migrates) the owner's tables on a new connection; `unavailable`
        makes the owner's own error from a sqlite3 error's text."""
        self.path = Path(path)
        self._prepare = prepare
        self._unavailable = unavailable
        self._busy_timeout_s = busy_timeout_s
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def run(self, call: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                try:
                    if self._db is None:
                        self._db = self._open()
                    return call(self._db)
                except sqlite3.Error as exc:
                    raise self._unavailable(f"sqlite {self.path}: {exc}") from exc

        return await asyncio.to_thread(locked)

    async def run_operation(self, operation: Operation[T], *, transaction: bool = False) -> T:
        """Runs a store's operation (gateway/ledger/store/operation.py) in the connection's thread,
        in a write transaction if asked: it holds the whole database, so a read and the write that
        follows it are never interleaved with another writer's."""
        return await self.run(lambda db: _drive(db, operation, transaction))

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            self._prepare(db)
        except BaseException:
            db.close()
            raise
        return db

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None

        await asyncio.to_thread(close)


class write_transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (on an autocommit connection). IMMEDIATE
    takes the write lock at the start, so what the transaction read is still true when it writes."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


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

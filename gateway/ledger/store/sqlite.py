"""The embedded ledger store: one SQLite file (stdlib sqlite3), used off the event loop.

One connection, used by one thread at a time (a lock; calls run in asyncio's default thread
pool). WAL lets readers (the usage API, `meridian usage export`) run while the worker writes, and
several gateway processes (`--workers`) may share the file: writers wait up to busy_timeout.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.event import UsageEvent
from gateway.ledger.store import sql
from gateway.ledger.store.interface import AggregateQuery, AggregateRow


def _q(statement: str) -> str:
    return statement.replace("%s", "?")


class SqliteLedger:
    name = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def _run(self, call: Any, *args: Any) -> Any:
        def locked() -> Any:
            with self._lock:
                if self._db is None:
                    self._db = self._open()
                try:
                    return call(self._db, *args)
                except sqlite3.Error as exc:
                    raise LedgerUnavailable(f"sqlite {self.path}: {exc}") from exc

        return await asyncio.to_thread(locked)

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(
            self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")  # a committed batch survives a power cut; then it is acked
        for statement in sql.SCHEMA:
            db.execute(statement)
        present = {row[1] for row in db.execute("PRAGMA table_info(usage_events)")}
        for column, kind in sql.ADDED_COLUMNS:
            if column not in present:
                try:
                    db.execute(f"ALTER TABLE usage_events ADD COLUMN {column} {kind}")
                except sqlite3.OperationalError as exc:
                    if "duplicate column" not in str(exc):  # another process added it first
                        raise
        return db

    async def start(self) -> None:
        await self._run(lambda db: None)

    async def commit(self, events: Sequence[UsageEvent]) -> int:
        unique = sql.unique_by_request(events)
        if not unique:
            return 0
        return int(await self._run(_commit, unique))

    async def aggregate(self, query: AggregateQuery) -> list[AggregateRow]:
        statement, params = sql.aggregate_sql(query)
        rows = await self._run(lambda db: db.execute(_q(statement), params).fetchall())
        return sql.aggregate_rows(query, rows)

    async def events(
        self, start_ms: int, end_ms: int, tenant_id: str | None, *, after: tuple[int, str] | None, limit: int
    ) -> list[UsageEvent]:
        statement, params = sql.events_sql(start_ms, end_ms, tenant_id, after, limit)
        rows = await self._run(lambda db: db.execute(_q(statement), params).fetchall())
        return [sql.row_event(row) for row in rows]

    async def purge(self, before_ms: int) -> int:
        def purge(db: sqlite3.Connection) -> int:
            deleted = 0
            with _transaction(db):
                for statement in sql.PURGE:
                    deleted += db.execute(_q(statement), (before_ms,)).rowcount
            return deleted

        return int(await self._run(purge))

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None

        await asyncio.to_thread(close)


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def _commit(db: sqlite3.Connection, events: list[UsageEvent]) -> int:
    insert = _q(sql.INSERT_EVENT)
    with _transaction(db):
        new = [e for e in events if db.execute(insert, sql.event_row(e)).rowcount == 1]
        if new:
            db.executemany(_q(sql.UPSERT_ROLLUP), sql.rollup_rows(new))
    return len(new)

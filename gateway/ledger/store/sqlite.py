"""The embedded ledger store: one SQLite file (stdlib sqlite3), used off the event loop through
`SqliteFile` (one connection, WAL: the usage API and `meridian usage export` read while the worker
writes; several gateway processes may share the file)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.event import UsageEvent
from gateway.ledger.store import sql
from gateway.ledger.store.interface import AggregateQuery, AggregateRow
from gateway.ledger.store.sqlite_file import SqliteFile, write_transaction


def _q(statement: str) -> str:
    return statement.replace("%s", "?")


class SqliteLedger:
    name = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self._file = SqliteFile(
            path, prepare=_prepare, unavailable=LedgerUnavailable, busy_timeout_s=busy_timeout_s
        )
        self.path = self._file.path

    async def _run(self, call: Any, *args: Any) -> Any:
        return await self._file.run(lambda db: call(db, *args))

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
            with write_transaction(db):
                for statement in sql.PURGE:
                    deleted += db.execute(_q(statement), (before_ms,)).rowcount
            return deleted

        return int(await self._run(purge))

    async def close(self) -> None:
        await self._file.close()


def _prepare(db: sqlite3.Connection) -> None:
    """The ledger's tables, and the columns added since the first release."""
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


def _commit(db: sqlite3.Connection, events: list[UsageEvent]) -> int:
    insert = _q(sql.INSERT_EVENT)
    with write_transaction(db):
        new = [e for e in events if db.execute(insert, sql.event_row(e)).rowcount == 1]
        if new:
            db.executemany(_q(sql.UPSERT_ROLLUP), sql.rollup_rows(new))
    return len(new)

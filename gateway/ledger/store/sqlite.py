"""The embedded ledger store: one SQLite file (stdlib sqlite3), used off the event loop through
`SqliteFile` (one connection, WAL: the usage API and `meridian usage export` read while the worker
writes; several gateway processes may share the file).

A batch is three statements in one write transaction, whatever its size: which of its request ids
are stored already, then the new events inserted and their rollup deltas upserted, each from one
JSON array (gateway/ledger/store/bulk.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TypeVar

from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.store import sql
from gateway.ledger.store.bulk import SQLITE, require_sqlite_json
from gateway.ledger.store.operation import Operation
from gateway.ledger.store.operations import BatchStatements, LedgerStore
from gateway.ledger.store.sqlite_file import SqliteFile

T = TypeVar("T")


class SqliteLedger(LedgerStore):
    name = "sqlite"
    batch = BatchStatements.on(SQLITE, returning=False)

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self._file = SqliteFile(
            path, prepare=_prepare, unavailable=LedgerUnavailable, busy_timeout_s=busy_timeout_s
        )
        self.path = self._file.path

    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T:
        return await self._file.run_operation(operation, transaction=transaction)

    async def start(self) -> None:
        await self._file.run(lambda db: None)  # opening the connection creates the schema

    async def close(self) -> None:
        await self._file.close()


def _prepare(db: sqlite3.Connection) -> None:
    """The ledger's tables, and the columns added since the first release."""
    require_sqlite_json(db)
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

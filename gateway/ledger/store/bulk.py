"""Many rows as one statement, for the stores on the ledger's database (the usage ledger, the
batch store): a store's multi-row write selects its rows from parameters its database unpacks,
never a statement per row.

Why: Python's sqlite3 releases the GIL around every statement's step and takes it back after, so
`executemany` of N rows, run in a worker thread beside the event loop, takes the GIL from the
loop N times. Under load the loop then spends more CPU handing the GIL back and forth (futex
calls) than the rows cost to write, and the write itself takes many times longer. PostgreSQL
takes the rows in one round trip the same way.

  SQLite      one JSON array of rows, read by `json_each` (SQLite's JSON functions): JSON numbers
              come back exact; a NUL would end a text value, so the stores keep NUL out of what
              they write (the ledger's names never hold one; batch input refuses it).
  PostgreSQL  one array per column, read by `unnest`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

Rows = Sequence[Sequence[object]]


@dataclass(frozen=True)
class Bulk:
    """How one database takes many rows as one statement's parameters."""

    # The SELECT of the packed rows, given each column's SQL type (PostgreSQL casts the arrays).
    select: Callable[[Sequence[str]], str]
    # The rows, each `width` values long, as that SELECT's parameters.
    pack: Callable[[Rows, int], Sequence[object]]


def _json_select(types: Sequence[str]) -> str:
    columns = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(len(types)))
    return f"SELECT {columns} FROM json_each(%s)"


def _json_pack(rows: Rows, width: int) -> Sequence[object]:
    del width  # each row carries its own
    # Text, not bytes: SQLite's JSON functions refuse a BLOB. Booleans arrive as 1 and 0, as
    # sqlite3 binds them.
    return (msgspec.json.encode(rows).decode(),)


def _unnest_select(types: Sequence[str]) -> str:
    return "SELECT * FROM unnest(" + ", ".join(f"%s::{t}[]" for t in types) + ")"


def _columns(rows: Rows, width: int) -> Sequence[object]:
    return [[row[i] for row in rows] for i in range(width)]


def require_sqlite_json(db: sqlite3.Connection) -> None:
    """Refuses, in words, a SQLite without its JSON functions (built in since 3.38, and compiled
    into the usual builds before): a store opening its file calls it first."""
    try:
        db.execute("SELECT value FROM json_each('[1]')").fetchall()
    except sqlite3.OperationalError as exc:
        raise sqlite3.OperationalError(
            f"this Python's SQLite {sqlite3.sqlite_version} lacks the JSON functions the stores write "
            f"rows with ({exc}); use a PostgreSQL store, or a Python whose SQLite has them"
        ) from exc


SQLITE = Bulk(select=_json_select, pack=_json_pack)
POSTGRES = Bulk(select=_unnest_select, pack=_columns)

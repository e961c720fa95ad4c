"""The batch store: files, batches, their lines and the lines' leases, in one SQLite database
(the ledger's file; PostgreSQL is not built yet).

Leases are columns of the rows they guard: a line is claimed by setting `lease_owner` and
`lease_until` in one write transaction, so two gateways never hold the same line; a line whose
holder died is claimable again once `lease_until` has passed. A result is only written by the
line's current holder, so each line gets exactly one answer. Finalizing (writing the output
files) takes a lease on the batch row the same way.

One connection, used by one thread at a time (a lock; calls run in asyncio's thread pool), as
the ledger's SQLite store does; several gateway processes share the file through WAL.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gateway.batches.errors import BatchStoreUnavailable
from gateway.batches.input import InputLine
from gateway.batches.records import RUNNABLE, TIMESTAMPS, BatchRecord, ClaimedLine, FileRecord, LineResult

T = TypeVar("T")

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batch_files (
        id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
        bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, deleted INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS batches (
        id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, api_key_id TEXT NOT NULL, endpoint TEXT NOT NULL,
        input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, metadata TEXT, callback_url TEXT,
        status TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
        in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER,
        expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
        output_file_id TEXT, error_file_id TEXT, total INTEGER NOT NULL,
        lease_owner TEXT, lease_until REAL, callback_pending INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant_id)",
    """CREATE TABLE IF NOT EXISTS batch_lines (
        batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
        body TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
        result TEXT, lease_owner TEXT, lease_until REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (batch_id, line_no))""",
    "CREATE INDEX IF NOT EXISTS batch_lines_claimable ON batch_lines (status, lease_until)",
)
_BATCH_COLUMNS = (
    "id, tenant_id, api_key_id, endpoint, input_file_id, completion_window, metadata, callback_url, "
    "status, created_at, expires_at, " + ", ".join(TIMESTAMPS) + ", output_file_id, error_file_id, total"
)
_RUNNABLE_SQL = "(" + ", ".join(f"'{s}'" for s in RUNNABLE) + ")"


class SqliteBatchStore:
    name = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        def locked() -> T:
            with self._lock:
                if self._db is None:
                    self._db = self._open()
                try:
                    return call(self._db, *args)
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
        for statement in SCHEMA:
            db.execute(statement)
        return db

    async def start(self) -> None:
        await self._run(lambda db: None)

    async def close(self) -> None:
        def close() -> None:
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None

        await asyncio.to_thread(close)

    # -- files ------------------------------------------------------------------------------------

    async def add_file(self, record: FileRecord) -> None:
        def add(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO batch_files (id, tenant_id, filename, purpose, bytes, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.tenant_id,
                    record.filename,
                    record.purpose,
                    record.bytes,
                    record.created_at,
                ),
            )

        await self._run(add)

    async def get_file(self, file_id: str, tenant_id: str) -> FileRecord | None:
        def get(db: sqlite3.Connection) -> FileRecord | None:
            row = db.execute(
                "SELECT id, tenant_id, filename, purpose, bytes, created_at FROM batch_files "
                "WHERE id = ? AND tenant_id = ? AND deleted = 0",
                (file_id, tenant_id),
            ).fetchone()
            return FileRecord(*row) if row else None

        return await self._run(get)

    async def delete_file(self, file_id: str, tenant_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE batch_files SET deleted = 1 WHERE id = ? AND tenant_id = ? AND deleted = 0",
                (file_id, tenant_id),
            )
            return cursor.rowcount == 1

        return await self._run(delete)

    # -- batches ----------------------------------------------------------------------------------

    async def add_batch(self, batch: BatchRecord, lines: Sequence[InputLine]) -> None:
        def add(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute(
                    "INSERT INTO batches (id, tenant_id, api_key_id, endpoint, input_file_id, completion_window, "
                    "metadata, callback_url, status, created_at, expires_at, total) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        batch.id,
                        batch.tenant_id,
                        batch.api_key_id,
                        batch.endpoint,
                        batch.input_file_id,
                        batch.completion_window,
                        json.dumps(batch.metadata) if batch.metadata is not None else None,
                        batch.callback_url,
                        batch.status,
                        batch.created_at,
                        batch.expires_at,
                        len(lines),
                    ),
                )
                db.executemany(
                    "INSERT INTO batch_lines (batch_id, line_no, custom_id, url, body) VALUES (?, ?, ?, ?, ?)",
                    [(batch.id, ln.line_no, ln.custom_id, ln.url, json.dumps(ln.body)) for ln in lines],
                )

        await self._run(add)

    async def get_batch(self, batch_id: str, tenant_id: str | None) -> BatchRecord | None:
        """`tenant_id` None: whoever owns it (the runner)."""

        def get(db: sqlite3.Connection) -> BatchRecord | None:
            row = db.execute(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or (tenant_id is not None and row[1] != tenant_id):
                return None
            return _with_counts(db, _batch(row))

        return await self._run(get)

    async def list_batches(self, tenant_id: str, *, limit: int, after: str | None) -> list[BatchRecord]:
        """Newest first; `after`: the last id of the previous page."""

        def page(db: sqlite3.Connection) -> list[BatchRecord]:
            # rowid: the order batches were created in (created_at has whole seconds only).
            where, params = "tenant_id = ?", [tenant_id]
            if after is not None:
                where += " AND rowid < (SELECT rowid FROM batches WHERE id = ? AND tenant_id = ?)"
                params += [after, tenant_id]
            rows = db.execute(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE {where} ORDER BY rowid DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
            return [_with_counts(db, _batch(row)) for row in rows]

        return await self._run(page)

    async def cancel(self, batch_id: str, tenant_id: str, now: int) -> bool:
        """A runnable batch starts cancelling; False if it was not runnable."""

        def cancel(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                f"UPDATE batches SET status = 'cancelling', cancelling_at = ? "
                f"WHERE id = ? AND tenant_id = ? AND status IN {_RUNNABLE_SQL}",
                (now, batch_id, tenant_id),
            )
            return cursor.rowcount == 1

        return await self._run(cancel)

    # -- the runner's leases ----------------------------------------------------------------------

    async def claim_lines(self, owner: str, now: float, lease_s: float, limit: int) -> list[ClaimedLine]:
        """Up to `limit` pending lines of runnable, unexpired batches whose lease is free."""

        def claim(db: sqlite3.Connection) -> list[ClaimedLine]:
            with _transaction(db):
                rows = db.execute(
                    "SELECT l.batch_id, l.line_no, l.custom_id, l.url, l.body, l.attempts, b.tenant_id, b.api_key_id "
                    "FROM batch_lines l JOIN batches b ON b.id = l.batch_id "
                    f"WHERE l.status = 'pending' AND l.lease_until < ? AND b.status IN {_RUNNABLE_SQL} "
                    "AND b.expires_at > ? ORDER BY b.created_at, l.batch_id, l.line_no LIMIT ?",
                    (now, now, limit),
                ).fetchall()
                db.executemany(
                    "UPDATE batch_lines SET lease_owner = ?, lease_until = ? WHERE batch_id = ? AND line_no = ?",
                    [(owner, now + lease_s, row[0], row[1]) for row in rows],
                )
                for batch_id in {row[0] for row in rows}:
                    db.execute(
                        "UPDATE batches SET status = 'in_progress', in_progress_at = ? "
                        "WHERE id = ? AND status = 'validating'",
                        (int(now), batch_id),
                    )
            return [ClaimedLine(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7]) for r in rows]

        return await self._run(claim)

    async def renew(self, owner: str, keys: Sequence[tuple[str, int]], until: float) -> list[tuple[str, int]]:
        def renew(db: sqlite3.Connection) -> list[tuple[str, int]]:
            with _transaction(db):
                db.executemany(
                    "UPDATE batch_lines SET lease_until = ? WHERE batch_id = ? AND line_no = ? "
                    "AND lease_owner = ? AND status = 'pending'",
                    [(until, batch_id, line_no, owner) for batch_id, line_no in keys],
                )
                stopped = {
                    row[0]
                    for row in db.execute(
                        f"SELECT id FROM batches WHERE id IN ({', '.join('?' * len(keys))}) "
                        f"AND status NOT IN {_RUNNABLE_SQL}",
                        [batch_id for batch_id, _ in keys],
                    )
                }
            return [key for key in keys if key[0] in stopped]

        return await self._run(renew)

    async def finish_line(self, owner: str, line: ClaimedLine, status: str, result: dict[str, Any]) -> bool:
        """The line's answer, written only while `owner` holds it; False: it was lost (ignored)."""

        def finish(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE batch_lines SET status = ?, result = ?, attempts = attempts + 1, lease_owner = NULL "
                "WHERE batch_id = ? AND line_no = ? AND lease_owner = ? AND status = 'pending'",
                (status, json.dumps(result), line.batch_id, line.line_no, owner),
            )
            return cursor.rowcount == 1

        return await self._run(finish)

    async def retry_line(self, owner: str, line: ClaimedLine, not_before: float) -> None:
        """Give the line back, claimable again from `not_before` (capacity was short)."""

        def retry(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE batch_lines SET attempts = attempts + 1, lease_owner = NULL, lease_until = ? "
                "WHERE batch_id = ? AND line_no = ? AND lease_owner = ? AND status = 'pending'",
                (not_before, line.batch_id, line.line_no, owner),
            )

        await self._run(retry)

    async def claim_finishable(self, owner: str, now: float, lease_s: float) -> list[tuple[BatchRecord, str]]:
        """Batches ready to end, each with the status it ends in, leased to `owner`: runnable
        ones with no pending line (completed) or past their window (expired), and cancelling
        ones with no line still running (cancelled). Completing ones move to `finalizing`."""

        def claim(db: sqlite3.Connection) -> list[tuple[BatchRecord, str]]:
            with _transaction(db):
                rows = db.execute(
                    f"SELECT {_BATCH_COLUMNS} FROM batches b WHERE (b.lease_until IS NULL OR b.lease_until < ?) AND ("
                    f"(b.status IN {_RUNNABLE_SQL} AND NOT EXISTS (SELECT 1 FROM batch_lines l "
                    "  WHERE l.batch_id = b.id AND l.status = 'pending'))"
                    f" OR (b.status IN ('cancelling', 'finalizing') OR (b.status IN {_RUNNABLE_SQL} AND b.expires_at <= ?))"
                    "  AND NOT EXISTS (SELECT 1 FROM batch_lines l WHERE l.batch_id = b.id "
                    "  AND l.status = 'pending' AND l.lease_owner IS NOT NULL AND l.lease_until >= ?))",
                    (now, now, now),
                ).fetchall()
                found = []
                for row in rows:
                    batch = _batch(row)
                    if batch.status == "cancelling":
                        ending = "cancelled"
                    elif batch.status in RUNNABLE and batch.expires_at <= now:
                        ending = "expired"
                    else:
                        ending = "completed"
                    db.execute(
                        "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ?",
                        (owner, now + lease_s, batch.id),
                    )
                    if ending == "completed" and batch.status != "finalizing":
                        db.execute(
                            "UPDATE batches SET status = 'finalizing', finalizing_at = ? WHERE id = ?",
                            (int(now), batch.id),
                        )
                        batch.status = "finalizing"
                        batch.times["finalizing_at"] = int(now)
                    found.append((_with_counts(db, batch), ending))
            return found

        return await self._run(claim)

    async def lines(self, batch_id: str) -> list[LineResult]:
        def lines(db: sqlite3.Connection) -> list[LineResult]:
            rows = db.execute(
                "SELECT batch_id, line_no, custom_id, status, result FROM batch_lines WHERE batch_id = ? ORDER BY line_no",
                (batch_id,),
            ).fetchall()
            return [LineResult(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None) for r in rows]

        return await self._run(lines)

    async def end_batch(
        self,
        owner: str,
        batch_id: str,
        status: str,
        now: int,
        output_file_id: str | None,
        error_file_id: str | None,
        files: Sequence[FileRecord],
    ) -> bool:
        """The batch ends in `status` with its output files registered; False if `owner` lost it."""

        def end(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                cursor = db.execute(
                    f"UPDATE batches SET status = ?, {status}_at = ?, output_file_id = ?, error_file_id = ?, "
                    "lease_owner = NULL, callback_pending = (callback_url IS NOT NULL) "
                    "WHERE id = ? AND lease_owner = ?",
                    (status, now, output_file_id, error_file_id, batch_id, owner),
                )
                if cursor.rowcount != 1:
                    return False
                db.executemany(
                    "INSERT INTO batch_files (id, tenant_id, filename, purpose, bytes, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    [(f.id, f.tenant_id, f.filename, f.purpose, f.bytes, f.created_at) for f in files],
                )
                return True

        return await self._run(end)

    async def callbacks_due(self) -> list[BatchRecord]:
        def due(db: sqlite3.Connection) -> list[BatchRecord]:
            rows = db.execute(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE callback_pending = 1").fetchall()
            return [_with_counts(db, _batch(row)) for row in rows]

        return await self._run(due)

    async def callback_done(self, batch_id: str) -> bool:
        """Marks the callback sent; False if another gateway already took it."""

        def done(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE batches SET callback_pending = 0 WHERE id = ? AND callback_pending = 1", (batch_id,)
            )
            return cursor.rowcount == 1

        return await self._run(done)


def _batch(row: Sequence[Any]) -> BatchRecord:
    times = dict(zip(TIMESTAMPS, row[11 : 11 + len(TIMESTAMPS)], strict=True))
    rest = row[11 + len(TIMESTAMPS) :]
    return BatchRecord(
        id=row[0],
        tenant_id=row[1],
        api_key_id=row[2],
        endpoint=row[3],
        input_file_id=row[4],
        completion_window=row[5],
        metadata=json.loads(row[6]) if row[6] else None,
        callback_url=row[7],
        status=row[8],
        created_at=row[9],
        expires_at=row[10],
        times=times,
        output_file_id=rest[0],
        error_file_id=rest[1],
        total=rest[2],
    )


def _with_counts(db: sqlite3.Connection, batch: BatchRecord) -> BatchRecord:
    for status, count in db.execute(
        "SELECT status, COUNT(*) FROM batch_lines WHERE batch_id = ? GROUP BY status", (batch.id,)
    ):
        if status == "completed":
            batch.completed = count
        elif status == "failed":
            batch.failed = count
    return batch


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")

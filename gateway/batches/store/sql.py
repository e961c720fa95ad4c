"""The batch store's tables and the SQL text both databases run (`%s` placeholders; the SQLite
store substitutes `?`), and how a batch row becomes a record. What differs between the two
databases is a `Dialect`: how many rows go in as one statement, how batches are numbered and how
rows being leased are locked."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.batches.records import RUNNABLE, TIMESTAMPS, BatchRecord, FileRecord
from gateway.ledger.store.bulk import Bulk


@dataclass(frozen=True)
class Dialect:
    bulk: Bulk  # how a batch's lines go in as one statement (gateway/ledger/store/bulk.py)
    seq_column: str  # the `seq` column's definition: creation order, for listing
    next_seq: str  # the value an inserted batch's `seq` gets
    lock_rows: str  # appended to a SELECT of rows about to be leased ({} their alias): skip what others take
    tenant_lock: str | None  # run first when adding a batch: serializes a tenant's creates (one %s)


def schema(dialect: Dialect) -> tuple[str, ...]:
    return (
        """CREATE TABLE IF NOT EXISTS batch_files (
        id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
        bytes BIGINT NOT NULL, created_at BIGINT NOT NULL, deleted BOOLEAN NOT NULL DEFAULT FALSE)""",
        "CREATE INDEX IF NOT EXISTS batch_files_by_tenant ON batch_files (tenant_id, created_at, id)",
        f"""CREATE TABLE IF NOT EXISTS batches (
        id TEXT PRIMARY KEY, {dialect.seq_column}, tenant_id TEXT NOT NULL, api_key_id TEXT NOT NULL,
        endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL,
        metadata TEXT, callback_url TEXT, status TEXT NOT NULL, created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL, in_progress_at BIGINT, finalizing_at BIGINT, completed_at BIGINT,
        failed_at BIGINT, expired_at BIGINT, cancelling_at BIGINT, cancelled_at BIGINT,
        output_file_id TEXT, error_file_id TEXT, total BIGINT NOT NULL, errors TEXT,
        lease_owner TEXT, lease_until DOUBLE PRECISION, callback_pending BOOLEAN NOT NULL DEFAULT FALSE)""",
        "CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant_id, seq)",
        """CREATE TABLE IF NOT EXISTS batch_lines (
        batch_id TEXT NOT NULL, line_no BIGINT NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
        body TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', attempts BIGINT NOT NULL DEFAULT 0,
        result TEXT, lease_owner TEXT, lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,
        prompt_tokens BIGINT NOT NULL DEFAULT 0, cached_tokens BIGINT NOT NULL DEFAULT 0,
        completion_tokens BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (batch_id, line_no))""",
        "CREATE INDEX IF NOT EXISTS batch_lines_claimable ON batch_lines (status, lease_until)",
    )


LINE_COLUMNS = ("batch_id", "line_no", "custom_id", "url", "body")
LINE_TYPES = ("text", "bigint", "text", "text", "text")


def insert_lines(dialect: Dialect) -> str:
    """A batch's lines, packed (`dialect.bulk.pack`), in one statement: 50,000 lines as one
    statement each would make SQLite's thread contend with the event loop for the GIL at each."""
    return f"INSERT INTO batch_lines ({', '.join(LINE_COLUMNS)}) {dialect.bulk.select(LINE_TYPES)}"


FILE_COLUMNS = "id, tenant_id, filename, purpose, bytes, created_at"
INSERT_FILE = f"INSERT INTO batch_files ({FILE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s)"
BATCH_FIELDS = (
    "id", "tenant_id", "api_key_id", "endpoint", "input_file_id", "completion_window", "metadata",
    "callback_url", "status", "created_at", "expires_at", *TIMESTAMPS, "output_file_id",
    "error_file_id", "total", "errors",
)  # fmt: skip
JSON_FIELDS = ("metadata", "errors")  # stored as JSON text
BATCH_COLUMNS = ", ".join(f"b.{name}" for name in BATCH_FIELDS)
RUNNABLE_SQL = "(" + ", ".join(f"'{s}'" for s in RUNNABLE) + ")"
# The tenant's enqueued lines: still to run, in batches that will run them.
ENQUEUED = (
    "SELECT COUNT(*) FROM batch_lines l JOIN batches b ON b.id = l.batch_id "
    f"WHERE b.tenant_id = %s AND b.status IN {RUNNABLE_SQL} AND l.status = 'pending'"
)
# Claimable lines dealt round-robin by tenant: each tenant's lines numbered in its own order
# (oldest batch first, then line order), then the first of every tenant, the second of every
# tenant, ... with the tenant whose oldest batch is oldest first in each round.
CLAIMABLE = (
    "SELECT l.batch_id, l.line_no, l.custom_id, l.url, l.body, l.attempts, c.tenant_id, c.api_key_id "
    "FROM batch_lines l JOIN ("
    " SELECT l2.batch_id, l2.line_no, b.tenant_id, b.api_key_id,"
    " ROW_NUMBER() OVER (PARTITION BY b.tenant_id ORDER BY b.seq, l2.line_no) AS turn,"
    " MIN(b.seq) OVER (PARTITION BY b.tenant_id) AS tenant_first"
    " FROM batch_lines l2 JOIN batches b ON b.id = l2.batch_id"
    f" WHERE l2.status = 'pending' AND l2.lease_until < %s AND b.status IN {RUNNABLE_SQL} AND b.expires_at > %s"
    ") c ON c.batch_id = l.batch_id AND c.line_no = l.line_no "
    # Again on `l`: PostgreSQL re-checks these on a row another gateway changed since the snapshot.
    "WHERE l.status = 'pending' AND l.lease_until < %s ORDER BY c.turn, c.tenant_first LIMIT %s"
)
FINISHABLE = (
    f"SELECT {BATCH_COLUMNS} FROM batches b WHERE (b.lease_until IS NULL OR b.lease_until < %s) AND ("
    f"(b.status IN {RUNNABLE_SQL} AND NOT EXISTS (SELECT 1 FROM batch_lines l"
    " WHERE l.batch_id = b.id AND l.status = 'pending'))"
    f" OR (b.status IN ('cancelling', 'finalizing') OR (b.status IN {RUNNABLE_SQL} AND b.expires_at <= %s))"
    " AND NOT EXISTS (SELECT 1 FROM batch_lines l WHERE l.batch_id = b.id"
    " AND l.status = 'pending' AND l.lease_owner IS NOT NULL AND l.lease_until >= %s))"
)


def to_json(value: Any) -> str | None:
    return json.dumps(value) if value is not None else None


def file_params(record: FileRecord) -> tuple[Any, ...]:
    return (record.id, record.tenant_id, record.filename, record.purpose, record.bytes, record.created_at)


def batch_row(batch: BatchRecord, *, total: int) -> tuple[Any, ...]:
    """The values of BATCH_FIELDS for a new batch."""
    values = {name: getattr(batch, name, None) for name in BATCH_FIELDS}
    values.update({name: batch.times.get(name) for name in TIMESTAMPS})
    values.update({name: to_json(values[name]) for name in JSON_FIELDS}, total=total)
    return tuple(values[name] for name in BATCH_FIELDS)


def batch_from_row(row: Sequence[Any]) -> BatchRecord:
    values = dict(zip(BATCH_FIELDS, row, strict=True))
    times = {name: values.pop(name) for name in TIMESTAMPS}
    for name in JSON_FIELDS:
        values[name] = json.loads(values[name]) if values[name] else None
    return BatchRecord(**values, times=times)

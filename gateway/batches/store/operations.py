"""What the batch store does, written once for both databases: each operation is a generator that
yields the statements it runs (`%s` placeholders) and is sent back their results, so the SQLite
and PostgreSQL stores only drive it (in a thread, or on the event loop) inside their own
transaction (the SQL text and the tables are in sql.py).

Leases are columns of the rows they guard: a line is claimed by setting `lease_owner` and
`lease_until` in one write transaction, so two gateways never hold the same line; a line whose
holder died is claimable again once `lease_until` has passed. A result is only written by the
line's current holder, so each line gets exactly one answer. Finalizing (writing the output
files) takes a lease on the batch row the same way.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from gateway.batches.input import InputLine
from gateway.batches.records import (
    RUNNABLE,
    TIMESTAMPS,
    BatchRecord,
    ClaimedLine,
    FileRecord,
    LineResult,
    LineUsage,
)
from gateway.batches.store import sql
from gateway.batches.store.sql import Dialect

T = TypeVar("T")


@dataclass(frozen=True)
class Statement:
    sql: str
    params: Sequence[Any] = ()
    many: bool = False  # `params` is a sequence of parameter rows, one run each
    fetch: bool = False  # the rows come back


@dataclass(frozen=True)
class Reply:
    rows: list[tuple[Any, ...]]
    rowcount: int


Operation = Generator[Statement, Reply, T]


# -- files ----------------------------------------------------------------------------------------


def add_file(record: FileRecord) -> Operation[None]:
    yield Statement(sql.INSERT_FILE, sql.file_params(record))


def get_file(file_id: str, tenant_id: str) -> Operation[FileRecord | None]:
    reply = yield Statement(
        f"SELECT {sql.FILE_COLUMNS} FROM batch_files WHERE id = %s AND tenant_id = %s AND NOT deleted",
        (file_id, tenant_id),
        fetch=True,
    )
    return FileRecord(*reply.rows[0]) if reply.rows else None


def delete_file(file_id: str, tenant_id: str) -> Operation[bool]:
    reply = yield Statement(
        "UPDATE batch_files SET deleted = TRUE WHERE id = %s AND tenant_id = %s AND NOT deleted",
        (file_id, tenant_id),
    )
    return reply.rowcount == 1


# -- batches --------------------------------------------------------------------------------------


def add_batch(
    dialect: Dialect, batch: BatchRecord, lines: Sequence[InputLine], enqueued_limit: int
) -> Operation[bool]:
    if dialect.tenant_lock is not None:
        yield Statement(dialect.tenant_lock, (batch.tenant_id,), fetch=True)
    enqueued = (yield Statement(sql.ENQUEUED, (batch.tenant_id,), fetch=True)).rows[0][0]
    accepted = enqueued + len(lines) <= enqueued_limit
    if accepted:
        row = sql.batch_row(batch, total=len(lines))
    else:
        failed = {**batch.times, "failed_at": batch.created_at}
        row = sql.batch_row(replace(batch, status="failed", times=failed), total=len(lines))
    yield Statement(
        f"INSERT INTO batches ({', '.join(sql.BATCH_FIELDS)}, seq, callback_pending) "
        f"VALUES ({', '.join(['%s'] * len(row))}, {dialect.next_seq}, %s)",
        # A batch refused here has ended: its callback is due like any other ended batch's.
        (*row, not accepted and batch.callback_url is not None),
    )
    if accepted and lines:
        yield Statement(
            "INSERT INTO batch_lines (batch_id, line_no, custom_id, url, body) VALUES (%s, %s, %s, %s, %s)",
            [(batch.id, ln.line_no, ln.custom_id, ln.url, json.dumps(ln.body)) for ln in lines],
            many=True,
        )
    return accepted


def get_batch(batch_id: str, tenant_id: str | None) -> Operation[BatchRecord | None]:
    reply = yield Statement(
        f"SELECT {sql.BATCH_COLUMNS} FROM batches b WHERE b.id = %s", (batch_id,), fetch=True
    )
    if not reply.rows or (tenant_id is not None and reply.rows[0][1] != tenant_id):
        return None
    return (yield from _with_counts(sql.batch_from_row(reply.rows[0])))


def list_batches(tenant_id: str, limit: int, after: str | None) -> Operation[list[BatchRecord]]:
    # seq: the order batches were created in (created_at has whole seconds only).
    where, params = "b.tenant_id = %s", [tenant_id]
    if after is not None:
        where += " AND b.seq < (SELECT seq FROM batches WHERE id = %s AND tenant_id = %s)"
        params += [after, tenant_id]
    reply = yield Statement(
        f"SELECT {sql.BATCH_COLUMNS} FROM batches b WHERE {where} ORDER BY b.seq DESC LIMIT %s",
        (*params, limit),
        fetch=True,
    )
    return (yield from _all_with_counts(reply.rows))


def cancel(batch_id: str, tenant_id: str, now: int) -> Operation[bool]:
    reply = yield Statement(
        "UPDATE batches SET status = 'cancelling', cancelling_at = %s "
        f"WHERE id = %s AND tenant_id = %s AND status IN {sql.RUNNABLE_SQL}",
        (now, batch_id, tenant_id),
    )
    return reply.rowcount == 1


# -- the runner's leases --------------------------------------------------------------------------


def claim_lines(
    dialect: Dialect, owner: str, now: float, lease_s: float, limit: int
) -> Operation[list[ClaimedLine]]:
    reply = yield Statement(sql.CLAIMABLE + dialect.lock_rows.format("l"), (now, now, now, limit), fetch=True)
    rows = reply.rows
    if not rows:
        return []
    yield Statement(
        "UPDATE batch_lines SET lease_owner = %s, lease_until = %s WHERE batch_id = %s AND line_no = %s",
        [(owner, now + lease_s, row[0], row[1]) for row in rows],
        many=True,
    )
    yield Statement(
        "UPDATE batches SET status = 'in_progress', in_progress_at = %s WHERE id = %s AND status = 'validating'",
        [(int(now), batch_id) for batch_id in sorted({row[0] for row in rows})],
        many=True,
    )
    return [ClaimedLine(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7]) for r in rows]


def renew(owner: str, keys: Sequence[tuple[str, int]], until: float) -> Operation[list[tuple[str, int]]]:
    if not keys:
        return []
    yield Statement(
        "UPDATE batch_lines SET lease_until = %s WHERE batch_id = %s AND line_no = %s "
        "AND lease_owner = %s AND status = 'pending'",
        [(until, batch_id, line_no, owner) for batch_id, line_no in keys],
        many=True,
    )
    batch_ids = sorted({batch_id for batch_id, _ in keys})
    reply = yield Statement(
        f"SELECT id FROM batches WHERE id IN ({', '.join(['%s'] * len(batch_ids))}) "
        f"AND status NOT IN {sql.RUNNABLE_SQL}",
        batch_ids,
        fetch=True,
    )
    stopped = {row[0] for row in reply.rows}
    return [key for key in keys if key[0] in stopped]


def finish_line(
    owner: str, line: ClaimedLine, status: str, result: dict[str, Any], usage: LineUsage
) -> Operation[bool]:
    reply = yield Statement(
        "UPDATE batch_lines SET status = %s, result = %s, attempts = attempts + 1, lease_owner = NULL, "
        "prompt_tokens = %s, cached_tokens = %s, completion_tokens = %s "
        "WHERE batch_id = %s AND line_no = %s AND lease_owner = %s AND status = 'pending'",
        (
            status,
            json.dumps(result),
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            line.batch_id,
            line.line_no,
            owner,
        ),
    )
    return reply.rowcount == 1


def retry_line(owner: str, line: ClaimedLine, not_before: float) -> Operation[None]:
    yield Statement(
        "UPDATE batch_lines SET attempts = attempts + 1, lease_owner = NULL, lease_until = %s "
        "WHERE batch_id = %s AND line_no = %s AND lease_owner = %s AND status = 'pending'",
        (not_before, line.batch_id, line.line_no, owner),
    )


def claim_finishable(
    dialect: Dialect, owner: str, now: float, lease_s: float
) -> Operation[list[tuple[BatchRecord, str]]]:
    reply = yield Statement(sql.FINISHABLE + dialect.lock_rows.format("b"), (now, now, now), fetch=True)
    found = []
    for row in reply.rows:
        batch = sql.batch_from_row(row)
        if batch.status == "cancelling":
            ending = "cancelled"
        elif batch.status in RUNNABLE and batch.expires_at <= now:
            ending = "expired"
        else:
            ending = "completed"
        yield Statement(
            "UPDATE batches SET lease_owner = %s, lease_until = %s WHERE id = %s",
            (owner, now + lease_s, batch.id),
        )
        if ending == "completed" and batch.status != "finalizing":
            yield Statement(
                "UPDATE batches SET status = 'finalizing', finalizing_at = %s WHERE id = %s",
                (int(now), batch.id),
            )
            batch.status = "finalizing"
            batch.times["finalizing_at"] = int(now)
        found.append(((yield from _with_counts(batch)), ending))
    return found


def lines(batch_id: str) -> Operation[list[LineResult]]:
    reply = yield Statement(
        "SELECT batch_id, line_no, custom_id, status, result FROM batch_lines WHERE batch_id = %s ORDER BY line_no",
        (batch_id,),
        fetch=True,
    )
    return [LineResult(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None) for r in reply.rows]


def end_batch(
    owner: str,
    batch_id: str,
    status: str,
    now: int,
    output_file_id: str | None,
    error_file_id: str | None,
    files: Sequence[FileRecord],
) -> Operation[bool]:
    if f"{status}_at" not in TIMESTAMPS:
        raise ValueError(f"a batch cannot end in {status!r}")
    reply = yield Statement(
        f"UPDATE batches SET status = %s, {status}_at = %s, output_file_id = %s, error_file_id = %s, "
        "lease_owner = NULL, callback_pending = (callback_url IS NOT NULL) "
        "WHERE id = %s AND lease_owner = %s",
        (status, now, output_file_id, error_file_id, batch_id, owner),
    )
    if reply.rowcount != 1:
        return False
    if files:
        yield Statement(sql.INSERT_FILE, [sql.file_params(f) for f in files], many=True)
    return True


def callbacks_due() -> Operation[list[BatchRecord]]:
    reply = yield Statement(f"SELECT {sql.BATCH_COLUMNS} FROM batches b WHERE b.callback_pending", fetch=True)
    return (yield from _all_with_counts(reply.rows))


def callback_done(batch_id: str) -> Operation[bool]:
    reply = yield Statement(
        "UPDATE batches SET callback_pending = FALSE WHERE id = %s AND callback_pending", (batch_id,)
    )
    return reply.rowcount == 1


def _all_with_counts(rows: list[tuple[Any, ...]]) -> Operation[list[BatchRecord]]:
    batches = []
    for row in rows:
        batches.append((yield from _with_counts(sql.batch_from_row(row))))
    return batches


def _with_counts(batch: BatchRecord) -> Operation[BatchRecord]:
    """The batch's request counts and usage, from its lines (one query)."""
    reply = yield Statement(
        "SELECT status, COUNT(*), CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(cached_tokens) AS BIGINT), "
        "CAST(SUM(completion_tokens) AS BIGINT) "
        "FROM batch_lines WHERE batch_id = %s GROUP BY status",
        (batch.id,),
        fetch=True,
    )
    prompt = cached = completion = 0
    for status, count, p, c, o in reply.rows:
        if status == "completed":
            batch.completed = count
        elif status == "failed":
            batch.failed = count
        prompt, cached, completion = prompt + p, cached + c, completion + o
    batch.usage = LineUsage(prompt, cached, completion)
    return batch


class SqlBatchStore(ABC):
    """The `BatchStore` methods, each one operation run by the subclass's `_run` (in a write
    transaction where it reads then writes, or several rows must change together)."""

    dialect: Dialect

    @abstractmethod
    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T: ...

    @abstractmethod
    async def start(self) -> None:
        """Connect and create the tables if they are missing."""

    @abstractmethod
    async def close(self) -> None: ...

    async def add_file(self, record: FileRecord) -> None:
        await self._run(add_file(record))

    async def get_file(self, file_id: str, tenant_id: str) -> FileRecord | None:
        return await self._run(get_file(file_id, tenant_id))

    async def delete_file(self, file_id: str, tenant_id: str) -> bool:
        return await self._run(delete_file(file_id, tenant_id))

    async def add_batch(self, batch: BatchRecord, lines: Sequence[InputLine], *, enqueued_limit: int) -> bool:
        return await self._run(add_batch(self.dialect, batch, lines, enqueued_limit), transaction=True)

    async def get_batch(self, batch_id: str, tenant_id: str | None) -> BatchRecord | None:
        return await self._run(get_batch(batch_id, tenant_id))

    async def list_batches(self, tenant_id: str, *, limit: int, after: str | None) -> list[BatchRecord]:
        return await self._run(list_batches(tenant_id, limit, after))

    async def cancel(self, batch_id: str, tenant_id: str, now: int) -> bool:
        return await self._run(cancel(batch_id, tenant_id, now))

    async def claim_lines(self, owner: str, now: float, lease_s: float, limit: int) -> list[ClaimedLine]:
        return await self._run(claim_lines(self.dialect, owner, now, lease_s, limit), transaction=True)

    async def renew(self, owner: str, keys: Sequence[tuple[str, int]], until: float) -> list[tuple[str, int]]:
        return await self._run(renew(owner, keys, until), transaction=True)

    async def finish_line(
        self, owner: str, line: ClaimedLine, status: str, result: dict[str, Any], usage: LineUsage
    ) -> bool:
        return await self._run(finish_line(owner, line, status, result, usage))

    async def retry_line(self, owner: str, line: ClaimedLine, not_before: float) -> None:
        await self._run(retry_line(owner, line, not_before))

    async def claim_finishable(self, owner: str, now: float, lease_s: float) -> list[tuple[BatchRecord, str]]:
        return await self._run(claim_finishable(self.dialect, owner, now, lease_s), transaction=True)

    async def lines(self, batch_id: str) -> list[LineResult]:
        return await self._run(lines(batch_id))

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
        operation = end_batch(owner, batch_id, status, now, output_file_id, error_file_id, files)
        return await self._run(operation, transaction=True)

    async def callbacks_due(self) -> list[BatchRecord]:
        return await self._run(callbacks_due())

    async def callback_done(self, batch_id: str) -> bool:
        return await self._run(callback_done(batch_id))

"""What the batch store does, written once for both databases, in the style of every store on the
ledger's database (gateway/ledger/store/operation.py): each method is a generator of the
statements it runs; the SQLite and PostgreSQL stores only say where they run (the SQL text and the
tables are in sql.py).

Leases are columns of the rows they guard: a line is claimed by setting `lease_owner` and
`lease_until` in one write transaction, so two gateways never hold the same line; a line whose
holder died is claimable again once `lease_until` has passed. A result is only written by the
line's current holder, so each line gets exactly one answer. Finalizing (writing the output
files) takes a lease on the batch row the same way.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
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
from gateway.ledger.store.operation import Operation, Statement, operation

T = TypeVar("T")


class BatchStore(ABC):
    """The batch store, on the ledger's database: SQLite (the embedded default) and PostgreSQL
    (production) subclasses say where it is (`_run`) and how their SQL differs (`dialect`); each
    operation is written once, below."""

    name: str
    dialect: Dialect

    @abstractmethod
    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T: ...

    @abstractmethod
    async def start(self) -> None:
        """Connect and create the tables if they are missing."""

    @abstractmethod
    async def close(self) -> None: ...

    # -- files ----------------------------------------------------------------------------------------

    @operation()
    def add_file(self, record: FileRecord) -> Operation[None]:
        yield Statement(sql.INSERT_FILE, sql.file_params(record))

    @operation()
    def get_file(self, file_id: str, tenant_id: str) -> Operation[FileRecord | None]:
        reply = yield Statement(
            f"SELECT {sql.FILE_COLUMNS} FROM batch_files WHERE id = %s AND tenant_id = %s AND NOT deleted",
            (file_id, tenant_id),
            fetch=True,
        )
        return FileRecord(*reply.rows[0]) if reply.rows else None

    @operation()
    def list_files(
        self, tenant_id: str, *, purpose: str | None, limit: int, newest_first: bool, after: str | None
    ) -> Operation[list[FileRecord]]:
        """The tenant's files not deleted, by `created_at` and then id (whole seconds tie often, and
        the order must not change between pages); `after`: the last id of the previous page."""
        direction, beyond = ("DESC", "<") if newest_first else ("ASC", ">")
        where, params = "tenant_id = %s AND NOT deleted", [tenant_id]
        if purpose is not None:
            where += " AND purpose = %s"
            params.append(purpose)
        if after is not None:
            # A deleted file still marks its place, so a client that deletes each file of a page
            # as it walks the pages goes on after it; an unknown id gives an empty page, as the
            # batches list does.
            where += (
                f" AND (created_at, id) {beyond} "
                "(SELECT created_at, id FROM batch_files WHERE id = %s AND tenant_id = %s)"
            )
            params += [after, tenant_id]
        reply = yield Statement(
            f"SELECT {sql.FILE_COLUMNS} FROM batch_files WHERE {where} "
            f"ORDER BY created_at {direction}, id {direction} LIMIT %s",
            (*params, limit),
            fetch=True,
        )
        return [FileRecord(*row) for row in reply.rows]

    @operation()
    def delete_file(self, file_id: str, tenant_id: str) -> Operation[bool]:
        reply = yield Statement(
            "UPDATE batch_files SET deleted = TRUE WHERE id = %s AND tenant_id = %s AND NOT deleted",
            (file_id, tenant_id),
        )
        return reply.rowcount == 1

    # -- batches --------------------------------------------------------------------------------------

    @operation(transaction=True)
    def add_batch(
        self, batch: BatchRecord, lines: Sequence[InputLine], *, enqueued_limit: int
    ) -> Operation[bool]:
        """Stores the batch and its lines, in one transaction. If the tenant's enqueued lines
        (pending lines of its runnable batches) plus these would pass `enqueued_limit`, the batch
        is stored `failed` instead (failed_at = created_at, `batch.errors` kept, no lines) and
        False is returned. The count and the insert are atomic: two concurrent creates never
        both pass the limit. A batch that comes `failed` (its input file's fault) is stored as
        it is, with no lines, and False is returned."""
        if batch.status == "failed":  # refused before it was stored: ended, with no lines to count
            accepted, row = False, sql.batch_row(batch, total=0)
        else:
            if self.dialect.tenant_lock is not None:
                yield Statement(self.dialect.tenant_lock, (batch.tenant_id,), fetch=True)
            enqueued = (yield Statement(sql.ENQUEUED, (batch.tenant_id,), fetch=True)).rows[0][0]
            accepted = enqueued + len(lines) <= enqueued_limit
            if accepted:
                row = sql.batch_row(batch, total=len(lines))
            else:
                failed = {**batch.times, "failed_at": batch.created_at}
                row = sql.batch_row(replace(batch, status="failed", times=failed), total=len(lines))
        yield Statement(
            f"INSERT INTO batches ({', '.join(sql.BATCH_FIELDS)}, seq, callback_pending) "
            f"VALUES ({', '.join(['%s'] * len(row))}, {self.dialect.next_seq}, %s)",
            # A batch refused here has ended: its callback is due like any other ended batch's.
            (*row, not accepted and batch.callback_url is not None),
        )
        if accepted and lines:
            rows = [(batch.id, ln.line_no, ln.custom_id, ln.url, json.dumps(ln.body)) for ln in lines]
            yield Statement(
                sql.insert_lines(self.dialect), self.dialect.bulk.pack(rows, len(sql.LINE_COLUMNS))
            )
        return accepted

    @operation()
    def get_batch(self, batch_id: str, tenant_id: str | None) -> Operation[BatchRecord | None]:
        """`tenant_id` None: whoever owns it (the runner)."""
        reply = yield Statement(
            f"SELECT {sql.BATCH_COLUMNS} FROM batches b WHERE b.id = %s", (batch_id,), fetch=True
        )
        if not reply.rows or (tenant_id is not None and reply.rows[0][1] != tenant_id):
            return None
        return (yield from self._with_counts(sql.batch_from_row(reply.rows[0])))

    @operation()
    def list_batches(self, tenant_id: str, *, limit: int, after: str | None) -> Operation[list[BatchRecord]]:
        """Newest first (by creation order, not by the whole-second `created_at`); `after`: the
        last id of the previous page."""
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
        return (yield from self._all_with_counts(reply.rows))

    @operation()
    def cancel(self, batch_id: str, tenant_id: str, now: int) -> Operation[bool]:
        """A runnable batch starts cancelling; False if it was not runnable."""
        reply = yield Statement(
            "UPDATE batches SET status = 'cancelling', cancelling_at = %s "
            f"WHERE id = %s AND tenant_id = %s AND status IN {sql.RUNNABLE_SQL}",
            (now, batch_id, tenant_id),
        )
        return reply.rowcount == 1

    # -- the runner's leases --------------------------------------------------------------------------

    @operation(transaction=True)
    def claim_lines(self, owner: str, now: float, lease_s: float, limit: int) -> Operation[list[ClaimedLine]]:
        """Up to `limit` pending lines of runnable, unexpired batches whose lease is free, fair
        across tenants: taken round-robin by tenant (each tenant's oldest batch first, in line
        order), so one tenant's huge batch does not hold back another tenant's small one."""
        reply = yield Statement(
            sql.CLAIMABLE + self.dialect.lock_rows.format("l"), (now, now, now, limit), fetch=True
        )
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

    @operation(transaction=True)
    def renew(
        self, owner: str, keys: Sequence[tuple[str, int]], until: float
    ) -> Operation[list[tuple[str, int]]]:
        """Extends `owner`'s leases on these lines; returns those whose batch stopped running
        (cancelled or expired): the runner aborts them."""
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

    @operation()
    def finish_line(
        self, owner: str, line: ClaimedLine, status: str, result: dict[str, Any], usage: LineUsage
    ) -> Operation[bool]:
        """The line's answer and its tokens, written only while `owner` holds it; False: it was
        lost (ignored). A batch's `usage` is the sum over its answered lines."""
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

    @operation()
    def retry_line(self, owner: str, line: ClaimedLine, not_before: float) -> Operation[None]:
        """Give the line back, claimable again from `not_before` (capacity was short)."""
        yield Statement(
            "UPDATE batch_lines SET attempts = attempts + 1, lease_owner = NULL, lease_until = %s "
            "WHERE batch_id = %s AND line_no = %s AND lease_owner = %s AND status = 'pending'",
            (not_before, line.batch_id, line.line_no, owner),
        )

    @operation(transaction=True)
    def claim_finishable(
        self, owner: str, now: float, lease_s: float
    ) -> Operation[list[tuple[BatchRecord, str]]]:
        """Batches ready to end, each with the status it ends in, leased to `owner`: runnable
        ones with no pending line (completed) or past their window (expired), and cancelling
        ones with no line still running (cancelled). Completing ones move to `finalizing`."""
        reply = yield Statement(
            sql.FINISHABLE + self.dialect.lock_rows.format("b"), (now, now, now), fetch=True
        )
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
            found.append(((yield from self._with_counts(batch)), ending))
        return found

    @operation()
    def lines(self, batch_id: str) -> Operation[list[LineResult]]:
        reply = yield Statement(
            "SELECT batch_id, line_no, custom_id, status, result FROM batch_lines WHERE batch_id = %s ORDER BY line_no",
            (batch_id,),
            fetch=True,
        )
        return [LineResult(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None) for r in reply.rows]

    @operation(transaction=True)
    def end_batch(
        self,
        owner: str,
        batch_id: str,
        status: str,
        now: int,
        output_file_id: str | None,
        error_file_id: str | None,
        files: Sequence[FileRecord],
    ) -> Operation[bool]:
        """The batch ends in `status` with its output files registered; False if `owner` lost it."""
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

    @operation()
    def callbacks_due(self) -> Operation[list[BatchRecord]]:
        reply = yield Statement(
            f"SELECT {sql.BATCH_COLUMNS} FROM batches b WHERE b.callback_pending", fetch=True
        )
        return (yield from self._all_with_counts(reply.rows))

    @operation()
    def callback_done(self, batch_id: str) -> Operation[bool]:
        """Marks the callback sent; False if another gateway already took it."""
        reply = yield Statement(
            "UPDATE batches SET callback_pending = FALSE WHERE id = %s AND callback_pending", (batch_id,)
        )
        return reply.rowcount == 1

    def _all_with_counts(self, rows: list[tuple[Any, ...]]) -> Operation[list[BatchRecord]]:
        batches = []
        for row in rows:
            batches.append((yield from self._with_counts(sql.batch_from_row(row))))
        return batches

    def _with_counts(self, batch: BatchRecord) -> Operation[BatchRecord]:
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

"""The batch store seam: one interface, on the ledger's database: SQLite (the embedded default)
and PostgreSQL (production)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gateway.batches.input import InputLine
from gateway.batches.records import BatchRecord, ClaimedLine, FileRecord, LineResult, LineUsage


class BatchStore(Protocol):
    name: str

    async def start(self) -> None:
        """Connect and create the tables if they are missing."""
        ...

    async def close(self) -> None: ...

    async def add_file(self, record: FileRecord) -> None: ...

    async def get_file(self, file_id: str, tenant_id: str) -> FileRecord | None: ...

    async def delete_file(self, file_id: str, tenant_id: str) -> bool: ...

    async def add_batch(self, batch: BatchRecord, lines: Sequence[InputLine], *, enqueued_limit: int) -> bool:
        """Stores the batch and its lines, in one transaction. If the tenant's enqueued lines
        (pending lines of its runnable batches) plus these would pass `enqueued_limit`, the batch
        is stored `failed` instead (failed_at = created_at, `batch.errors` kept, no lines) and
        False is returned. The count and the insert are atomic: two concurrent creates never
        both pass the limit."""
        ...

    async def get_batch(self, batch_id: str, tenant_id: str | None) -> BatchRecord | None:
        """`tenant_id` None: whoever owns it (the runner)."""
        ...

    async def list_batches(self, tenant_id: str, *, limit: int, after: str | None) -> list[BatchRecord]:
        """Newest first (by creation order, not by the whole-second `created_at`); `after`: the
        last id of the previous page."""
        ...

    async def cancel(self, batch_id: str, tenant_id: str, now: int) -> bool:
        """A runnable batch starts cancelling; False if it was not runnable."""
        ...

    async def claim_lines(self, owner: str, now: float, lease_s: float, limit: int) -> list[ClaimedLine]:
        """Up to `limit` pending lines of runnable, unexpired batches whose lease is free, fair
        across tenants: taken round-robin by tenant (each tenant's oldest batch first, in line
        order), so one tenant's huge batch does not hold back another tenant's small one."""
        ...

    async def renew(self, owner: str, keys: Sequence[tuple[str, int]], until: float) -> list[tuple[str, int]]:
        """Extends `owner`'s leases on these lines; returns those whose batch stopped running
        (cancelled or expired): the runner aborts them."""
        ...

    async def finish_line(
        self, owner: str, line: ClaimedLine, status: str, result: dict[str, Any], usage: LineUsage
    ) -> bool:
        """The line's answer and its tokens, written only while `owner` holds it; False: it was
        lost (ignored). A batch's `usage` is the sum over its answered lines."""
        ...

    async def retry_line(self, owner: str, line: ClaimedLine, not_before: float) -> None:
        """Give the line back, claimable again from `not_before` (capacity was short)."""
        ...

    async def claim_finishable(self, owner: str, now: float, lease_s: float) -> list[tuple[BatchRecord, str]]:
        """Batches ready to end, each with the status it ends in, leased to `owner`: runnable
        ones with no pending line (completed) or past their window (expired), and cancelling
        ones with no line still running (cancelled). Completing ones move to `finalizing`."""
        ...

    async def lines(self, batch_id: str) -> list[LineResult]: ...

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
        ...

    async def callbacks_due(self) -> list[BatchRecord]: ...

    async def callback_done(self, batch_id: str) -> bool:
        """Marks the callback sent; False if another gateway already took it."""
        ...

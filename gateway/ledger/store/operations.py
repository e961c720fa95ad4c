"""What the ledger store does, written once for SQLite and PostgreSQL as generators of the
statements they run (gateway/ledger/store/operation.py, the style of every store on this
database); the subclasses say where they run and how their database takes many rows in one
statement (gateway/ledger/store/bulk.py), from which `BatchStatements` are built."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from gateway.ledger.event import UsageEvent
from gateway.ledger.store import sql
from gateway.ledger.store.bulk import Bulk
from gateway.ledger.store.interface import AggregateQuery, AggregateRow
from gateway.ledger.store.operation import Operation, Statement, operation

T = TypeVar("T")


@dataclass(frozen=True)
class BatchStatements:
    """A batch committed in the same few statements whatever its size, never a statement per
    event: its rows go packed (gateway/ledger/store/bulk.py), which for SQLite keeps the worker
    thread from contending with the event loop for the GIL at every event."""

    bulk: Bulk
    # Inserts the packed events; returns the request ids it inserted, unless `stored` is set.
    insert_events: str
    # Adds the packed rollup deltas (sql.rollup_rows) to their buckets.
    upsert_rollups: str
    # For a database whose insert cannot return the new ids in one step (SQLite hands RETURNING
    # rows back one step each): which of the packed request ids are stored already. Read in the
    # same write transaction, so it is still true when the insert runs.
    stored: str | None

    @classmethod
    def on(cls, bulk: Bulk, *, returning: bool) -> BatchStatements:
        # `WHERE true`: SQLite's grammar needs it between an upsert's SELECT and its ON CONFLICT.
        insert = (
            f"INSERT INTO usage_events ({', '.join(sql.EVENT_COLUMNS)}) {bulk.select(sql.EVENT_TYPES)} "
            "WHERE true ON CONFLICT (request_id) DO NOTHING"
        )
        return cls(
            bulk=bulk,
            insert_events=insert + (" RETURNING request_id" if returning else ""),
            upsert_rollups=f"INSERT INTO usage_rollups ({', '.join(sql.ROLLUP_COLUMNS)}) "
            f"{bulk.select(sql.ROLLUP_TYPES)} WHERE true {sql.ROLLUP_CONFLICT}",
            stored=None
            if returning
            else f"SELECT request_id FROM usage_events WHERE request_id IN ({bulk.select(('text',))})",
        )


class LedgerStore(ABC):
    name: str
    batch: ClassVar[BatchStatements]

    @abstractmethod
    async def _run(self, operation: Operation[T], *, transaction: bool = False) -> T: ...

    @abstractmethod
    async def start(self) -> None:
        """Connect and create the schema if it is missing."""

    @abstractmethod
    async def close(self) -> None: ...

    async def commit(self, events: Sequence[UsageEvent]) -> int:
        """Insert the events whose request id is new and add only those to the rollups, in one
        transaction; returns how many were new. Committing the same event again changes nothing."""
        unique = sql.unique_by_request(events)
        return await self._commit(unique) if unique else 0

    @operation(transaction=True)
    def _commit(self, events: list[UsageEvent]) -> Operation[int]:
        # A redelivered event is neither stored nor counted twice, and a crash between the
        # statements rolls back all of them.
        batch = self.batch
        width = len(sql.EVENT_COLUMNS)
        if batch.stored is None:
            rows = [sql.event_row(e) for e in events]
            inserted = yield Statement(batch.insert_events, batch.bulk.pack(rows, width), fetch=True)
            new_ids = {row[0] for row in inserted.rows}
            new = [e for e in events if e.request_id in new_ids]
        else:
            ids = [(e.request_id,) for e in events]
            stored = yield Statement(batch.stored, batch.bulk.pack(ids, 1), fetch=True)
            old_ids = {row[0] for row in stored.rows}
            new = [e for e in events if e.request_id not in old_ids]
            if new:
                yield Statement(batch.insert_events, batch.bulk.pack([sql.event_row(e) for e in new], width))
        if new:
            deltas = sql.rollup_rows(new)
            yield Statement(batch.upsert_rollups, batch.bulk.pack(deltas, len(sql.ROLLUP_COLUMNS)))
        return len(new)

    @operation()
    def aggregate(self, query: AggregateQuery) -> Operation[list[AggregateRow]]:
        """Rollup sums per bucket (and group), non-empty buckets only, ordered by bucket."""
        statement, params = sql.aggregate_sql(query)
        reply = yield Statement(statement, params, fetch=True)
        return sql.aggregate_rows(query, reply.rows)

    @operation()
    def events(
        self, start_ms: int, end_ms: int, tenant_id: str | None, *, after: tuple[int, str] | None, limit: int
    ) -> Operation[list[UsageEvent]]:
        """Raw events in [start, end), ordered by (ts_ms, request_id), after the `after` key."""
        statement, params = sql.events_sql(start_ms, end_ms, tenant_id, after, limit)
        reply = yield Statement(statement, params, fetch=True)
        return [sql.row_event(row) for row in reply.rows]

    @operation(transaction=True)
    def purge(self, before_ms: int) -> Operation[int]:
        """Delete raw events and minute rollups older than `before_ms`; hour and day rollups stay."""
        deleted = 0
        for statement in sql.PURGE:
            deleted += (yield Statement(statement, (before_ms,))).rowcount
        return deleted

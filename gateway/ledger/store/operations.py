"""What the ledger store does, written once for SQLite and PostgreSQL as generators of the
statements they run (gateway/ledger/store/operation.py, the style of every store on this
database); the subclasses say where they run and how their database takes a whole batch of
events in a fixed number of statements (`BatchStatements`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from gateway.ledger.event import UsageEvent
from gateway.ledger.store import sql
from gateway.ledger.store.interface import AggregateQuery, AggregateRow
from gateway.ledger.store.operation import Operation, Statement, operation

T = TypeVar("T")

Rows = Sequence[Sequence[object]]


@dataclass(frozen=True)
class BatchStatements:
    """A batch committed in the same few statements whatever its size, never a statement per event.

    A statement per event made the SQLite store's thread take and drop the GIL hundreds of times
    per batch, each time while the event loop wanted it: under load that cost the gateway's
    request thread more CPU than the inserts themselves. `pack` puts a batch's rows into one
    statement's parameters (PostgreSQL: one array per column for `unnest`; SQLite: one JSON array
    for `json_each`); its second argument is the rows' width."""

    # Inserts the packed events; returns the request ids it inserted, unless `stored` is set.
    insert_events: str
    # Adds the packed rollup deltas (sql.rollup_rows) to their buckets.
    upsert_rollups: str
    pack: Callable[[Rows, int], Sequence[object]]
    # For a database whose insert cannot return the new ids in one step (SQLite hands RETURNING
    # rows back one step each): which of the packed request ids are stored already. Read in the
    # same write transaction, so it is still true when the insert runs.
    stored: str | None = None


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
            inserted = yield Statement(batch.insert_events, batch.pack(rows, width), fetch=True)
            new_ids = {row[0] for row in inserted.rows}
            new = [e for e in events if e.request_id in new_ids]
        else:
            ids = [(e.request_id,) for e in events]
            stored = yield Statement(batch.stored, batch.pack(ids, 1), fetch=True)
            old_ids = {row[0] for row in stored.rows}
            new = [e for e in events if e.request_id not in old_ids]
            if new:
                yield Statement(batch.insert_events, batch.pack([sql.event_row(e) for e in new], width))
        if new:
            deltas = sql.rollup_rows(new)
            yield Statement(batch.upsert_rollups, batch.pack(deltas, len(sql.ROLLUP_COLUMNS)))
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


def columns(rows: Rows, width: int) -> list[list[object]]:
    """Rows as one array per column, for `unnest`."""
    return [[row[i] for row in rows] for i in range(width)]

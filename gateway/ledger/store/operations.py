"""What the ledger store does, written once for SQLite and PostgreSQL as generators of the
statements they run (gateway/ledger/store/operation.py, the style of every store on this
database); the subclasses say where they run and, for a commit, whether the database takes a
whole batch of events in one statement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TypeVar

from gateway.ledger.event import UsageEvent
from gateway.ledger.store import sql
from gateway.ledger.store.interface import AggregateQuery, AggregateRow
from gateway.ledger.store.operation import Operation, Statement, operation

T = TypeVar("T")


class LedgerStore(ABC):
    name: str
    # A batch's events in one statement that returns the request ids it inserted, then its rollup
    # deltas in one (PostgreSQL's `unnest`: one round trip however many); None: a row at a time.
    insert_events: str | None = None
    upsert_rollups: str | None = None

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
        # A redelivered event is neither stored nor counted twice, and a crash between the two
        # statements rolls back both.
        new: list[UsageEvent] = []
        if self.insert_events is None:
            for event in events:
                if (yield Statement(sql.INSERT_EVENT, sql.event_row(event))).rowcount == 1:
                    new.append(event)
            if new:
                yield Statement(sql.UPSERT_ROLLUP, sql.rollup_rows(new), many=True)
            return len(new)
        rows = [sql.event_row(e) for e in events]
        reply = yield Statement(self.insert_events, _columns(rows, len(sql.EVENT_COLUMNS)), fetch=True)
        inserted = {row[0] for row in reply.rows}
        new = [e for e in events if e.request_id in inserted]
        if new and self.upsert_rollups is not None:
            deltas = sql.rollup_rows(new)
            yield Statement(self.upsert_rollups, _columns(deltas, len(sql.ROLLUP_COLUMNS)))
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


def _columns(rows: Sequence[Sequence[object]], width: int) -> list[list[object]]:
    """Rows as one array per column, for `unnest`."""
    return [[row[i] for row in rows] for i in range(width)]

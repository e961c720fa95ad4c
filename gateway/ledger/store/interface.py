"""The store seam: one interface, a SQLite file (embedded) and PostgreSQL (production)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.ledger.event import UsageEvent

Width = Literal["1m", "1h", "1d"]
WIDTH_MS: dict[str, int] = {"1m": 60_000, "1h": 3_600_000, "1d": 86_400_000}
# Columns a query may group by (rollup dimensions), in the order results name them.
DIMENSIONS = ("tenant_id", "model", "region", "api_key_id")


@dataclass(frozen=True)
class AggregateQuery:
    width: Width
    start_ms: int  # inclusive, aligned to the width
    end_ms: int  # exclusive, aligned to the width
    tenant_id: str | None  # None: every tenant (operator)
    group_by: tuple[str, ...] = ()  # a subset of DIMENSIONS


@dataclass(frozen=True)
class AggregateRow:
    bucket_ms: int
    group: tuple[tuple[str, str], ...]  # (dimension, value) for each group_by dimension
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost_usd: float


class LedgerStore(Protocol):
    name: str

    async def start(self) -> None:
        """Connect and create the schema if it is missing."""
        ...

    async def commit(self, events: Sequence[UsageEvent]) -> int:
        """Insert the events whose request id is new and add only those to the rollups, in one
        transaction; returns how many were new. Committing the same event again changes nothing."""
        ...

    async def aggregate(self, query: AggregateQuery) -> list[AggregateRow]:
        """Rollup sums per bucket (and group), non-empty buckets only, ordered by bucket."""
        ...

    async def events(
        self, start_ms: int, end_ms: int, tenant_id: str | None, *, after: tuple[int, str] | None, limit: int
    ) -> list[UsageEvent]:
        """Raw events in [start, end), ordered by (ts_ms, request_id), after the `after` key."""
        ...

    async def purge(self, before_ms: int) -> int:
        """Delete raw events and minute rollups older than `before_ms`; hour and day rollups stay."""
        ...

    async def close(self) -> None: ...

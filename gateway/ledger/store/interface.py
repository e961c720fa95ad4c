"""What a ledger query asks and what it gets back (the store is gateway/ledger/store/operations.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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

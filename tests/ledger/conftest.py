"""Ledger test fixtures: events, and a store of each kind (SQLite file, real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger.event import UsageEvent
from gateway.ledger.store import LedgerStore
from gateway.ledger.store.postgres import PostgresLedger
from gateway.ledger.store.sqlite import SqliteLedger

DAY_MS = 86_400_000
# 2026-11-01T00:00:00Z: a day edge, so tests can place events in exact buckets.
T0_MS = 1_793_491_200_000


def event(request_id: str, *, ts_ms: int = T0_MS, **fields: Any) -> UsageEvent:
    values: dict[str, Any] = {
        "request_id": request_id,
        "ts_ms": ts_ms,
        "tenant_id": "acme",
        "api_key_id": "key_aaaaaaaaaaaa",
        "model_requested": "meridian-small",
        "model": "meridian-small",
        "tier": "interactive",
        "region": "eu-west",
        "status": "ok",
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "completion_tokens": 5,
        "cost_usd": 0.001,
        "price_version": "test",
    }
    values.update(fields)
    return UsageEvent(**values)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LedgerStore]:
    """The same suite runs against both stores."""
    ledger: LedgerStore
    if request.param == "sqlite":
        ledger = SqliteLedger(tmp_path / "ledger.sqlite")
    else:
        ledger = PostgresLedger(request.getfixturevalue("postgres_dsn"), pool_size=2)
    await ledger.start()
    try:
        yield ledger
    finally:
        await ledger.close()

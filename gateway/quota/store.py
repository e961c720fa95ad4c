"""The store seam under the quota gate: the shared Redis store and the in-process one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.quota.model import AdmitOutcome, QuotaLimits, UsageReading

# Milliseconds since the epoch. Stores take one only so tests can drive time; in production the
# Redis store uses Redis server time, so replicas' clocks never matter.
Clock = Callable[[], int]


class Outbox(Protocol):
    """Where the in-process store puts usage events (gateway/ledger/outbox.py:LocalOutbox)."""

    def append(self, tenant_id: str, event: bytes) -> None: ...


class QuotaStore(Protocol):
    """One atomic operation per call; the Redis implementation makes exactly one round trip each."""

    name: str  # "redis" or "memory": where admissions were decided, for usage and tickets

    async def admit(
        self, tenant_id: str, limits: QuotaLimits, cost: int, lease_id: str, lease_ms: int
    ) -> AdmitOutcome: ...

    async def settle(
        self, tenant_id: str, slot: int, day: int, delta: int, lease_id: str, event: bytes | None = None
    ) -> None:
        """Also appends `event` (a usage event's JSON) to the tenant's usage stream or the
        in-process outbox, atomically with the settlement."""
        ...

    async def renew(self, tenant_id: str, lease_id: str, lease_ms: int, limit: int) -> int:
        """reference.RENEWED, REACQUIRED or LOST."""
        ...

    async def read(self, tenant_id: str) -> UsageReading: ...

    async def close(self) -> None: ...

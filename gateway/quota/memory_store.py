"""The in-process quota store: the reference algorithm on a dict, for `make up` and fail-open.

Every method runs to completion without awaiting, so on one event loop each call is atomic just
as a Lua script is in Redis.
"""

from __future__ import annotations

import time

from gateway.quota import reference
from gateway.quota.model import AdmitOutcome, QuotaLimits, UsageReading
from gateway.quota.store import Clock, Outbox
from gateway.quota.window import Geometry


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryQuotaStore:
    def __init__(
        self,
        *,
        geometry: Geometry | None = None,
        clock: Clock | None = None,
        name: str = "memory",
        outbox: Outbox | None = None,
    ):
        self.name = name
        self.outbox = outbox  # where settlements put usage events (gateway/ledger/outbox.py)
        self._geo = geometry or Geometry()
        self._clock = clock or wall_clock_ms
        self._tenants: dict[str, reference.TenantState] = {}

    def _state(self, tenant_id: str) -> reference.TenantState:
        state = self._tenants.get(tenant_id)
        if state is None:
            state = self._tenants[tenant_id] = reference.TenantState()
        return state

    async def admit(
        self, tenant_id: str, limits: QuotaLimits, cost: int, lease_id: str, lease_ms: int
    ) -> AdmitOutcome:
        return reference.admit(
            self._state(tenant_id), self._clock(), limits, cost, lease_id, lease_ms, self._geo
        )

    async def settle(
        self, tenant_id: str, slot: int, day: int, delta: int, lease_id: str, event: bytes | None = None
    ) -> None:
        reference.settle(self._state(tenant_id), self._clock(), slot, day, delta, lease_id, self._geo)
        if event is not None and self.outbox is not None:
            self.outbox.append(tenant_id, event)

    async def renew(self, tenant_id: str, lease_id: str, lease_ms: int, limit: int) -> int:
        return reference.renew(self._state(tenant_id), self._clock(), lease_id, lease_ms, limit)

    async def read(self, tenant_id: str) -> UsageReading:
        return reference.read(self._state(tenant_id), self._clock(), self._geo)

    async def close(self) -> None:
        self._tenants.clear()

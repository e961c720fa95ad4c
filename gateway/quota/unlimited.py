"""A QuotaGate that grants everything: for deployments without quotas and for tenants with no limits.

It keeps no state at all, so it cannot leak a reservation however a request ends.
"""

from __future__ import annotations

from typing import Any

from gateway.quota.interface import Admission
from router.types import TenantPolicy


class UnlimitedQuotaGate:
    async def admit(self, policy: TenantPolicy, *, request_id: str, estimated_tokens: int) -> Admission:
        return Admission(tenant_id=policy.tenant_id, request_id=request_id, reserved_tokens=estimated_tokens)

    async def renew(self, admission: Admission) -> None:
        return None

    async def settle(self, admission: Admission, *, actual_tokens: int) -> None:
        return None

    async def usage(self, policy: TenantPolicy) -> dict[str, Any]:
        return {"tenant_id": policy.tenant_id, "limited": False}

    async def close(self) -> None:
        return None

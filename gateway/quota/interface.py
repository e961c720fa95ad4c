"""The quota seam: what the gateway's request path asks of any quota store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from router.types import TenantPolicy


@dataclass
class Admission:
    """A granted reservation: 1 request, `reserved_tokens` tokens and (maybe) a concurrency lease.

    `headers` are the x-ratelimit-* headers to put on the response.
    """

    tenant_id: str
    request_id: str
    reserved_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    lease_id: str | None = None
    store_state: Any = None  # whatever the store needs to settle (e.g. window keys)


class QuotaGate(Protocol):
    async def admit(self, policy: TenantPolicy, *, request_id: str, estimated_tokens: int) -> Admission:
        """Reserve atomically, or raise RateLimitError (429 with Retry-After and x-ratelimit-*
        headers) or ServiceUnavailableError (fail-closed tenant while the store is down)."""
        ...

    async def renew(self, admission: Admission) -> None:
        """Extend the concurrency lease of a long-running (streaming) request."""
        ...

    async def settle(self, admission: Admission, *, actual_tokens: int) -> None:
        """Refund or charge the difference to the estimate and release the concurrency slot."""
        ...

    async def usage(self, policy: TenantPolicy) -> dict[str, Any]:
        """Current window use and remaining quota, for GET /v1/usage."""
        ...

    async def close(self) -> None: ...

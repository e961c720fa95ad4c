"""The quota seam: what the gateway's request path asks of any quota store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.quota.model import Ticket
from router.types import TenantPolicy


@dataclass
class Admission:
    """A granted reservation: 1 request, `reserved_tokens` tokens and (maybe) a concurrency lease.

    `headers` are the x-ratelimit-* headers to put on the response.
    """

    tenant_id: str
    request_id: str
    reserved_tokens: int
    store_state: Ticket  # what renewal and settlement need: which store, bucket, day and lease
    headers: dict[str, str] = field(default_factory=dict)
    lease_id: str | None = None


class QuotaGate(Protocol):
    async def admit(self, policy: TenantPolicy, *, request_id: str, estimated_tokens: int) -> Admission:
        """Reserve atomically, or raise QuotaExceeded (over a limit: when to retry and the
        x-ratelimit-* headers), QuotaUnavailable (fail-closed tenant while the store is down) or
        RequestTooLarge (the estimate alone exceeds a token limit)."""
        ...

    async def renew(self, admission: Admission) -> None:
        """Extend the concurrency lease of a long-running (streaming) request."""
        ...

    async def settle(self, admission: Admission, *, actual_tokens: int, event: bytes | None = None) -> None:
        """Refund or charge the difference to the estimate and release the concurrency slot; with
        `event`, append the request's usage event in the same atomic store operation."""
        ...

    async def usage(self, policy: TenantPolicy) -> dict[str, Any]:
        """Current window use and remaining quota, for GET /v1/quota; QuotaUnavailable as admit."""
        ...

    async def close(self) -> None: ...

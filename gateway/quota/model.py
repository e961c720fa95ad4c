"""Plain data shared by the quota stores: limits as the stores see them, and their answers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.types import TenantLimits

# Bits of AdmitOutcome.denied: which limits a refused request would have broken.
DENIED_REQUESTS = 1
DENIED_TOKENS = 2
DENIED_CONCURRENCY = 4
DENIED_DAILY = 8


@dataclass(frozen=True)
class QuotaLimits:
    """The limits one store enforces for one tenant; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None
    daily_tokens: int | None = None

    @classmethod
    def from_tenant(cls, limits: TenantLimits) -> QuotaLimits:
        return cls(
            requests_per_minute=limits.requests_per_minute,
            tokens_per_minute=limits.tokens_per_minute,
            concurrent_requests=limits.concurrent_requests,
            daily_tokens=limits.daily_tokens,
        )

    def scaled(self, share: float) -> QuotaLimits:
        """This replica's part of each limit while the shared store is unreachable (at least 1)."""

        def part(value: int | None) -> int | None:
            return None if value is None else max(1, math.floor(value * share))

        return QuotaLimits(
            requests_per_minute=part(self.requests_per_minute),
            tokens_per_minute=part(self.tokens_per_minute),
            concurrent_requests=part(self.concurrent_requests),
            daily_tokens=part(self.daily_tokens),
        )


@dataclass(frozen=True)
class AdmitOutcome:
    """A store's answer to one admission, granted or not. Counters are after the reservation."""

    admitted: bool
    denied: int  # DENIED_* bits; 0 when admitted
    retry_after_ms: int  # 0 when admitted
    requests_used: int
    requests_reset_ms: int
    tokens_used: int
    tokens_reset_ms: int
    concurrent_in_use: int
    daily_used: int
    slot: int  # bucket the tokens were charged to; settlement refunds it there
    day: int  # day (server time // 86400000) the daily budget was charged to
    now_ms: int  # store time of the decision


@dataclass(frozen=True)
class UsageReading:
    """What a tenant has used right now, for GET /v1/quota."""

    requests_used: int
    requests_reset_ms: int
    tokens_used: int
    tokens_reset_ms: int
    concurrent_in_use: int
    daily_used: int
    now_ms: int


@dataclass
class Ticket:
    """What settlement and renewal need to know about an admission (Admission.store_state)."""

    tenant_id: str
    source: str  # "redis", "memory" or "local" (the fail-open fallback)
    slot: int
    day: int
    lease_ms: int
    concurrent_limit: int | None
    settled: bool = False  # a second settle must not refund twice

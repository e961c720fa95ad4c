"""The quota algorithm on in-memory state: the reference the Lua scripts are tested against.

Each function is one script (admit.lua, settle.lua, renew.lua, usage.lua): same inputs, same
order of checks, same outputs. The in-process store runs these directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.quota.model import (
    DENIED_CONCURRENCY,
    DENIED_DAILY,
    DENIED_REQUESTS,
    DENIED_TOKENS,
    AdmitOutcome,
    QuotaLimits,
    UsageReading,
)
from gateway.quota.window import DAY_MS, Geometry, read_window, reset_ms, wait_ms

# A refused concurrency slot frees when some request settles, which nobody can predict.
CONCURRENCY_RETRY_MS = 1_000


@dataclass
class TenantState:
    """One tenant's counters: the Redis keys of gateway.quota.keys, as Python objects."""

    requests: dict[int, int] = field(default_factory=dict)  # bucket -> requests
    tokens: dict[int, int] = field(default_factory=dict)  # bucket -> tokens
    leases: dict[str, int] = field(default_factory=dict)  # lease id -> expiry (ms)
    day: int = -1
    day_used: int = 0


def _prune_leases(state: TenantState, now_ms: int) -> None:
    for lease_id in [k for k, expiry in state.leases.items() if expiry <= now_ms]:
        del state.leases[lease_id]


def admit(
    state: TenantState,
    now_ms: int,
    limits: QuotaLimits,
    cost: int,
    lease_id: str,
    lease_ms: int,
    geo: Geometry,
) -> AdmitOutcome:
    """Reserve 1 request, `cost` tokens and (if capped) a concurrency slot, all or nothing."""
    slot = geo.slot(now_ms)
    requests = read_window(state.requests, now_ms, geo)
    tokens = read_window(state.tokens, now_ms, geo)
    in_use = 0
    if limits.concurrent_requests is not None:
        _prune_leases(state, now_ms)
        in_use = len(state.leases)
    day = now_ms // DAY_MS
    day_used = state.day_used if state.day == day else 0

    denied, wait = 0, 0
    rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
    if rpm is not None and requests.used + 1 > rpm:
        denied |= DENIED_REQUESTS
        wait = max(wait, wait_ms(requests, 1, rpm, now_ms, geo))
    if tpm is not None and tokens.used + cost > tpm:
        denied |= DENIED_TOKENS
        wait = max(wait, wait_ms(tokens, cost, tpm, now_ms, geo))
    if limits.concurrent_requests is not None and in_use >= limits.concurrent_requests:
        denied |= DENIED_CONCURRENCY
        wait = max(wait, CONCURRENCY_RETRY_MS)
    if limits.daily_tokens is not None and day_used + cost > limits.daily_tokens:
        denied |= DENIED_DAILY
        wait = max(wait, (day + 1) * DAY_MS - now_ms)
    if denied:
        return AdmitOutcome(
            admitted=False,
            denied=denied,
            retry_after_ms=wait,
            requests_used=requests.used,
            requests_reset_ms=reset_ms(requests, now_ms, geo),
            tokens_used=tokens.used,
            tokens_reset_ms=reset_ms(tokens, now_ms, geo),
            concurrent_in_use=in_use,
            daily_used=day_used,
            slot=slot,
            day=day,
            now_ms=now_ms,
        )

    state.requests[slot] = state.requests.get(slot, 0) + 1
    state.tokens[slot] = state.tokens.get(slot, 0) + cost
    if limits.concurrent_requests is not None:
        state.leases[lease_id] = now_ms + lease_ms
        in_use += 1
    state.day, state.day_used = day, day_used + cost
    # After charging, the newest live bucket is the current one (unless cost was 0 tokens).
    tokens_reset = geo.expires_at(slot) - now_ms if cost > 0 else reset_ms(tokens, now_ms, geo)
    return AdmitOutcome(
        admitted=True,
        denied=0,
        retry_after_ms=0,
        requests_used=requests.used + 1,
        requests_reset_ms=geo.expires_at(slot) - now_ms,
        tokens_used=tokens.used + cost,
        tokens_reset_ms=tokens_reset,
        concurrent_in_use=in_use,
        daily_used=day_used + cost,
        slot=slot,
        day=day,
        now_ms=now_ms,
    )


def settle(
    state: TenantState, now_ms: int, slot: int, day: int, delta: int, lease_id: str, geo: Geometry
) -> None:
    """Apply `delta` = actual - reserved tokens and release the lease (if any).

    A refund goes back to the bucket the reservation was charged to (nothing to do if that bucket
    has already left the window); an overrun is charged to the current bucket, so it counts for
    the full window from now.
    """
    if delta < 0:
        have = state.tokens.get(slot)
        if have is not None:
            state.tokens[slot] = have - min(have, -delta)
        if state.day == day:
            state.day_used = max(0, state.day_used + delta)
    elif delta > 0:
        current = geo.slot(now_ms)
        state.tokens[current] = state.tokens.get(current, 0) + delta
        today = now_ms // DAY_MS
        if state.day == today:
            state.day_used += delta
        else:
            state.day, state.day_used = today, delta
    if lease_id:
        state.leases.pop(lease_id, None)


# renew() answers: the lease was extended, re-taken after it had expired, or lost to others.
RENEWED, REACQUIRED, LOST = 1, 2, 0


def renew(state: TenantState, now_ms: int, lease_id: str, lease_ms: int, limit: int) -> int:
    """Push a lease's expiry to now + lease_ms; re-take an expired one only if a slot is free."""
    _prune_leases(state, now_ms)
    if lease_id in state.leases:
        state.leases[lease_id] = now_ms + lease_ms
        return RENEWED
    if len(state.leases) < limit:
        state.leases[lease_id] = now_ms + lease_ms
        return REACQUIRED
    return LOST


def read(state: TenantState, now_ms: int, geo: Geometry) -> UsageReading:
    """Current use, without changing anything that counts."""
    requests = read_window(state.requests, now_ms, geo)
    tokens = read_window(state.tokens, now_ms, geo)
    return UsageReading(
        requests_used=requests.used,
        requests_reset_ms=reset_ms(requests, now_ms, geo),
        tokens_used=tokens.used,
        tokens_reset_ms=reset_ms(tokens, now_ms, geo),
        concurrent_in_use=sum(1 for expiry in state.leases.values() if expiry > now_ms),
        daily_used=state.day_used if state.day == now_ms // DAY_MS else 0,
        now_ms=now_ms,
    )

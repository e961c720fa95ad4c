"""OpenAI's rate-limit headers and messages, from a store's answer."""

from __future__ import annotations

import math

from gateway.quota.model import (
    DENIED_CONCURRENCY,
    DENIED_DAILY,
    DENIED_REQUESTS,
    DENIED_TOKENS,
    AdmitOutcome,
    QuotaLimits,
)


def format_duration(ms: int) -> str:
    """Go-style durations as OpenAI writes them: "120ms", "1s", "1.5s", "6m0s", "1h2m3s"."""
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


def retry_after_headers(ms: int) -> dict[str, str]:
    """`Retry-After` in whole seconds (at least 1, rounded up) and OpenAI's `retry-after-ms`."""
    return {"retry-after": str(max(1, math.ceil(ms / 1000))), "retry-after-ms": str(max(0, int(ms)))}


def rate_limit_headers(limits: QuotaLimits, outcome: AdmitOutcome) -> dict[str, str]:
    """x-ratelimit-* for the limits the tenant has; unlimited dimensions get no headers."""
    headers: dict[str, str] = {}
    if limits.requests_per_minute is not None:
        headers["x-ratelimit-limit-requests"] = str(limits.requests_per_minute)
        headers["x-ratelimit-remaining-requests"] = str(
            max(0, limits.requests_per_minute - outcome.requests_used)
        )
        headers["x-ratelimit-reset-requests"] = format_duration(outcome.requests_reset_ms)
    if limits.tokens_per_minute is not None:
        headers["x-ratelimit-limit-tokens"] = str(limits.tokens_per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, limits.tokens_per_minute - outcome.tokens_used))
        headers["x-ratelimit-reset-tokens"] = format_duration(outcome.tokens_reset_ms)
    return headers


def denial_message(tenant_id: str, limits: QuotaLimits, outcome: AdmitOutcome, cost: int) -> str:
    """OpenAI-like: which limit, the limit, what is used, what was asked, and when to retry."""
    parts = []
    if outcome.denied & DENIED_REQUESTS:
        parts.append(
            f"requests per minute (RPM): Limit {limits.requests_per_minute}, Used {outcome.requests_used}, Requested 1"
        )
    if outcome.denied & DENIED_TOKENS:
        parts.append(
            f"tokens per minute (TPM): Limit {limits.tokens_per_minute}, Used {outcome.tokens_used}, Requested {cost}"
        )
    if outcome.denied & DENIED_CONCURRENCY:
        parts.append(
            f"concurrent requests: Limit {limits.concurrent_requests}, In use {outcome.concurrent_in_use}"
        )
    if outcome.denied & DENIED_DAILY:
        parts.append(
            f"tokens per day: Limit {limits.daily_tokens}, Used {outcome.daily_used}, Requested {cost}"
        )
    return (
        f"Rate limit reached for tenant {tenant_id} on {'; '.join(parts)}. "
        f"Please try again in {format_duration(outcome.retry_after_ms)}."
    )

"""The body of GET /v1/quota: current window use and what is left, per limit."""

from __future__ import annotations

from typing import Any

from gateway.quota.headers import format_duration
from gateway.quota.model import QuotaLimits, UsageReading
from gateway.quota.window import DAY_MS, Geometry


def _remaining(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)


def usage_report(
    tenant_id: str, limits: QuotaLimits, reading: UsageReading, *, source: str, geometry: Geometry
) -> dict[str, Any]:
    """`source` says which store answered: "redis", "memory", or "local" (fail-open fallback,
    whose limits are this replica's share)."""
    day_reset_ms = (reading.now_ms // DAY_MS + 1) * DAY_MS - reading.now_ms
    return {
        "object": "quota.usage",
        "tenant": tenant_id,
        "source": source,
        "window_seconds": geometry.window_ms // 1000,
        "requests": {
            "limit": limits.requests_per_minute,
            "used": reading.requests_used,
            "remaining": _remaining(limits.requests_per_minute, reading.requests_used),
            "reset": format_duration(reading.requests_reset_ms),
        },
        "tokens": {
            "limit": limits.tokens_per_minute,
            "used": reading.tokens_used,
            "remaining": _remaining(limits.tokens_per_minute, reading.tokens_used),
            "reset": format_duration(reading.tokens_reset_ms),
        },
        "concurrent_requests": {
            "limit": limits.concurrent_requests,
            "in_use": reading.concurrent_in_use,
            "remaining": _remaining(limits.concurrent_requests, reading.concurrent_in_use),
        },
        "daily_tokens": {
            "limit": limits.daily_tokens,
            "used": reading.daily_used,
            "remaining": _remaining(limits.daily_tokens, reading.daily_used),
            "reset": format_duration(day_reset_ms),
        },
    }

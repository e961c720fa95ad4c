"""Prometheus view of the breakers, on a registry the caller injects."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class BreakerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._state = Gauge(
            "meridian_breaker_state",
            "Circuit breaker state per target: 0 closed, 1 half-open, 2 open.",
            ["target"],
            registry=registry,
        )
        self._rejections = Counter(
            "meridian_breaker_rejections_total",
            "Calls refused without contacting the target, by reason (open, probing, throttled).",
            ["target", "reason"],
            registry=registry,
        )

    def watch(self, target_id: str, read_state: Callable[[], int]) -> None:
        # Read at scrape time: open -> half-open happens by the clock, not on an event.
        self._state.labels(target_id).set_function(read_state)

    def rejected(self, target_id: str, reason: str) -> None:
        self._rejections.labels(target_id, reason).inc()

"""Prometheus metrics of provider calls, on a registry the caller injects."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.health import AttemptReport

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ProviderMetrics:
    """An AttemptObserver for provider targets: latency by provider, kind and phase, and errors
    by provider, kind and error kind (timeout, rate_limited, breaker_open, ...)."""

    def __init__(self, registry: CollectorRegistry, kinds: Mapping[str, str]) -> None:
        self._kinds = dict(kinds)  # provider id -> "openai" | "anthropic"
        self._latency = Histogram(
            "meridian_provider_latency_seconds",
            "Provider call latency: phase=first_byte until the answer starts, total until it ends.",
            ["provider", "kind", "phase"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self._errors = Counter(
            "meridian_provider_errors_total",
            "Failed provider calls, by error kind.",
            ["provider", "kind", "error"],
            registry=registry,
        )

    def observe(self, report: AttemptReport) -> None:
        kind = self._kinds.get(report.target_id, "unknown")
        if report.error is not None:
            self._errors.labels(report.target_id, kind, report.error).inc()
            return
        if report.first_byte_s is not None:
            self._latency.labels(report.target_id, kind, "first_byte").observe(report.first_byte_s)
        self._latency.labels(report.target_id, kind, "total").observe(report.latency_s)

"""Prometheus metrics of provider calls, on a registry the caller injects.

`ObservedUpstream` wraps a provider adapter and reports how each call went: latency until the
first byte and until the end, or the kind of error. It only watches; the verdict for the circuit
breaker is recorded by failover, the one place that does so for every upstream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.upstreams.base import Endpoint, Upstream, UpstreamError
from protocol.chunk import Chunk, Completion

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class AttemptReport:
    """What one call looked like."""

    target_id: str
    streamed: bool
    latency_s: float  # whole call (a stream: until it ended)
    first_byte_s: float | None  # until the response (or first chunk) arrived
    error: str | None  # error kind, None on success


def error_kind(exc: BaseException) -> str:
    """A small closed vocabulary for error metrics."""
    if isinstance(exc, UpstreamError):
        explicit = getattr(exc, "kind", None)
        if isinstance(explicit, str):
            return explicit
        if exc.status_code == 429:
            return "rate_limited"
        if exc.status_code == 504:
            return "timeout"
        return "server_error" if exc.retryable else "client_error"
    return "internal"


class ProviderMetrics:
    """Latency by provider, kind and phase, and errors by provider, kind and error kind
    (timeout, rate_limited, server_error, ...)."""

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


@dataclass
class _StreamWatch:
    started: float
    first_chunk_at: float | None = None
    error: BaseException | None = None


class ObservedUpstream:
    def __init__(
        self,
        inner: Upstream,
        target_id: str,
        metrics: ProviderMetrics | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.token_exact = inner.token_exact
        self.target_id = target_id
        self._metrics = metrics
        self._clock = clock

    def _report(
        self, streamed: bool, latency: float, first_byte: float | None, exc: BaseException | None
    ) -> None:
        if self._metrics is None:
            return
        # A caller going away (CancelledError is no Exception) is not an error of the target.
        error = error_kind(exc) if isinstance(exc, Exception) else None
        self._metrics.observe(AttemptReport(self.target_id, streamed, latency, first_byte, error))

    async def complete(self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]) -> Completion:
        started = self._clock()
        try:
            response = await self.inner.complete(endpoint, body, headers)
        except BaseException as exc:
            self._report(False, self._clock() - started, None, exc)
            raise
        elapsed = self._clock() - started
        self._report(False, elapsed, elapsed, None)
        return response

    @asynccontextmanager
    async def stream(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        watch = _StreamWatch(started=self._clock())
        try:
            async with self.inner.stream(endpoint, body, headers) as chunks:
                yield self._relay(chunks, watch)
        except BaseException as exc:
            # Only errors the upstream raised count against it; the consumer's own exceptions
            # pass through here too, and are no error of the target.
            if watch.error is None and watch.first_chunk_at is None and isinstance(exc, UpstreamError):
                watch.error = exc
            raise
        finally:
            elapsed = self._clock() - watch.started
            first_byte = None if watch.first_chunk_at is None else watch.first_chunk_at - watch.started
            self._report(True, elapsed, first_byte, watch.error)

    async def _relay(self, chunks: AsyncIterator[Chunk], watch: _StreamWatch) -> AsyncIterator[Chunk]:
        try:
            async for chunk in chunks:
                if watch.first_chunk_at is None:
                    watch.first_chunk_at = self._clock()
                yield chunk
        except UpstreamError as exc:
            watch.error = exc
            raise

    async def count_tokens(self, body: dict[str, Any], headers: dict[str, str]) -> int:
        # Not observed: a count is no generation, and its few milliseconds would pull the
        # provider's latency figures down.
        return await self.inner.count_tokens(body, headers)

    async def aclose(self) -> None:
        await self.inner.aclose()

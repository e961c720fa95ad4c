"""An Upstream behind its target's breaker: refused fast while open, outcomes fed back.

Generic over the target: providers use it, and so can nodes. How an attempt ends decides what
the breaker hears: a 429 is rate limiting (Retry-After honoured, no failure counted), other
retryable errors are failures, a non-retryable error is the client's (the target is healthy),
and a caller that walks away is no verdict at all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.health.board import BreakerBoard
from gateway.health.state import Clock, Outcome, Permit, Rejection
from gateway.upstreams.base import Endpoint, Upstream, UpstreamError


class TargetUnavailableError(UpstreamError):
    """Refused by the breaker without contacting the target; try the next one."""

    def __init__(self, target_id: str, rejection: Rejection, now: float) -> None:
        retry_after = max(rejection.until - now, 0.0) if rejection.until is not None else None
        super().__init__(
            f"target {target_id} is unavailable (breaker {rejection.reason})",
            status_code=503,
            retryable=True,
            retry_after=retry_after,
        )
        self.target_id = target_id
        self.reason = rejection.reason


@dataclass(frozen=True)
class AttemptReport:
    """What one attempt looked like, for metrics."""

    target_id: str
    streamed: bool
    latency_s: float  # whole call (a stream: until it ended)
    first_byte_s: float | None  # until the response (or first chunk) arrived
    error: str | None  # error kind, None on success


class AttemptObserver(Protocol):
    def observe(self, report: AttemptReport) -> None: ...


def error_kind(exc: BaseException) -> str:
    """A small closed vocabulary for error metrics."""
    if isinstance(exc, TargetUnavailableError):
        return "breaker_" + exc.reason
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


def classify(exc: BaseException) -> tuple[Outcome, float | None]:
    """The breaker's verdict on an attempt that raised `exc`, and the Retry-After to honour."""
    if isinstance(exc, UpstreamError):
        if getattr(exc, "kind", None) == "unsupported":
            return Outcome.NEUTRAL, None  # the request, not the target, was the problem
        if exc.status_code == 429:
            return Outcome.RATE_LIMITED, exc.retry_after
        return (Outcome.FAILURE if exc.retryable else Outcome.SUCCESS), None
    if isinstance(exc, Exception):
        return Outcome.FAILURE, None
    return Outcome.NEUTRAL, None  # CancelledError, GeneratorExit: the caller went away


@dataclass
class _StreamWatch:
    started: float
    first_chunk_at: float | None = None
    completed: bool = False
    error: BaseException | None = None


class GuardedUpstream:
    def __init__(
        self,
        inner: Upstream,
        board: BreakerBoard,
        target_id: str,
        *,
        observer: AttemptObserver | None = None,
        clock: Clock = time.monotonic,  # latencies
        wall_clock: Clock = time.time,  # breaker instants (shared between replicas)
    ) -> None:
        self.inner = inner
        self.token_exact = inner.token_exact
        self.target_id = target_id
        self._board = board
        self._observer = observer
        self._clock = clock
        self._wall_clock = wall_clock

    def _acquire(self, streamed: bool) -> Permit:
        result = self._board.try_acquire(self.target_id)
        if isinstance(result, Rejection):
            error = TargetUnavailableError(self.target_id, result, self._wall_clock())
            self._report(streamed, 0.0, None, error)
            raise error
        return result

    def _finish(self, permit: Permit, exc: BaseException | None) -> None:
        if exc is None:
            self._board.record(self.target_id, permit, Outcome.SUCCESS)
            return
        outcome, retry_after = classify(exc)
        self._board.record(self.target_id, permit, outcome, retry_after=retry_after)

    def _report(
        self, streamed: bool, latency: float, first_byte: float | None, exc: BaseException | None
    ) -> None:
        if self._observer is None:
            return
        # A caller going away (CancelledError is no Exception) is not an error of the target.
        error = error_kind(exc) if isinstance(exc, Exception) else None
        self._observer.observe(AttemptReport(self.target_id, streamed, latency, first_byte, error))

    async def complete(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        permit = self._acquire(streamed=False)
        started = self._clock()
        try:
            response = await self.inner.complete(endpoint, body, headers)
        except BaseException as exc:
            self._finish(permit, exc)
            elapsed = self._clock() - started
            self._report(False, elapsed, None, exc)
            raise
        self._finish(permit, None)
        elapsed = self._clock() - started
        self._report(False, elapsed, elapsed, None)
        return response

    @asynccontextmanager
    async def stream(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        permit = self._acquire(streamed=True)
        watch = _StreamWatch(started=self._clock())
        try:
            async with self.inner.stream(endpoint, body, headers) as chunks:
                yield self._relay(chunks, watch)
        except BaseException as exc:
            # Only errors the upstream raised count against it; the consumer's own exceptions
            # pass through here too, and are no verdict on the target.
            if watch.error is None and watch.first_chunk_at is None and isinstance(exc, UpstreamError):
                watch.error = exc
            raise
        finally:
            self._settle_stream(permit, watch)

    async def _relay(
        self, chunks: AsyncIterator[dict[str, Any]], watch: _StreamWatch
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            async for chunk in chunks:
                if watch.first_chunk_at is None:
                    watch.first_chunk_at = self._clock()
                yield chunk
        except UpstreamError as exc:
            watch.error = exc
            raise
        watch.completed = True

    def _settle_stream(self, permit: Permit, watch: _StreamWatch) -> None:
        elapsed = self._clock() - watch.started
        first_byte = None if watch.first_chunk_at is None else watch.first_chunk_at - watch.started
        if watch.error is not None:
            self._finish(permit, watch.error)
        elif watch.completed or watch.first_chunk_at is not None:
            self._finish(permit, None)  # it answered; a caller leaving early is not its fault
        else:
            self._board.record(self.target_id, permit, Outcome.NEUTRAL)
        self._report(True, elapsed, first_byte, watch.error)

    async def aclose(self) -> None:
        await self.inner.aclose()

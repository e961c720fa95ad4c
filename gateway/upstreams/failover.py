"""Failover before the first byte: try the decision's targets in order until one answers.

A retryable failure (connect error, timeout, 5xx, 429) moves on to the next target after a
full-jitter back-off, at most `retry.max_attempts` targets in all; a 4xx goes straight back to the
client. Only targets from the router's decision are ever tried, so failover cannot leave the
tenant's residency.

This is the one place where upstream outcomes reach the circuit breakers, the same way for nodes
and providers: a target whose breaker is unavailable is skipped (no attempt, no back-off), each
attempt holds a permit, and its verdict comes from `verdict()`. A stream's verdict is given at
its first chunk (the target answered); a stream that breaks later is reported through
`record_failure` and turns that success into a failure.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.config import RetryConfig
from gateway.health import Outcome, Permit, Rejection
from gateway.metrics import GatewayMetrics
from gateway.observe import QUIET, Stage
from gateway.runtime.tasks import run_shielded
from gateway.upstreams.base import Endpoint, Upstream, UpstreamError
from gateway.upstreams.errors import UpstreamRejected, UpstreamsExhausted
from gateway.upstreams.fleet import Fleet
from protocol.chunk import Chunk, Completion
from router import MAX_ATTEMPTS_BOUND, backoff_delays
from router.types import Target

T = TypeVar("T")
Attempt = Callable[[Target, dict[str, str]], Awaitable[T]]


async def next_chunk(chunks: AsyncIterator[Chunk], idle_s: float) -> Chunk | None:
    """The next upstream chunk, None at a clean end; UpstreamError if none comes within `idle_s`
    (a backstop to httpx's read timeout, so a stream can never hang)."""
    try:
        async with asyncio.timeout(idle_s):
            return await anext(chunks)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise UpstreamError(f"no stream chunk within {idle_s:g}s", status_code=504) from None


def verdict(error: BaseException) -> tuple[Outcome, float | None]:
    """What an attempt that raised `error` says about the target's health, and the Retry-After
    to honour: one classifier for every upstream."""
    if not isinstance(error, UpstreamError):
        return Outcome.NEUTRAL, None  # cancelled (the client went away) or a bug of ours
    if getattr(error, "kind", None) == "unsupported":
        return Outcome.NEUTRAL, None  # the request, not the target, was the problem
    if error.status_code == 429:
        return Outcome.RATE_LIMITED, error.retry_after
    if error.at_capacity:
        # A node refusing by its queue bound is busy, not broken: no verdict, or one tier's full
        # queue would eject the node for every tier. Its /load report steers routing meanwhile.
        return Outcome.NEUTRAL, None
    if error.status_code >= 500 or error.status_code == 408:
        return Outcome.FAILURE, None  # 5xx, connect error (502), timeout (504, 408)
    return Outcome.SUCCESS, None  # any other 4xx: the target answered, it is alive


@dataclass
class OpenedStream:
    """A stream whose first chunk has arrived; `aclose` closes the upstream connection (its owner,
    the ServedStream, shields that when it must survive a cancellation)."""

    target: Target
    attempts: int  # targets tried to get here, this one included
    chunks: AsyncIterator[Chunk]
    first: Chunk
    stack: AsyncExitStack

    async def aclose(self) -> None:
        await self.stack.aclose()


class Forwarder:
    def __init__(
        self,
        fleet: Fleet,
        metrics: GatewayMetrics,
        *,
        retry: RetryConfig,
        stream_idle_s: float,
        rng: random.Random | None = None,
    ) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._retry = retry
        self._stream_idle_s = stream_idle_s
        self._rng = rng or random.Random()

    async def complete(
        self,
        targets: Sequence[Target],
        endpoint: Endpoint,
        body: dict[str, Any],
        headers: dict[str, str],
        scope: Stage = QUIET,
    ) -> tuple[Target, Completion, int]:
        """`body` goes to each target asking for the model that target serves."""
        return await self._ask_each(
            targets,
            body,
            headers,
            scope,
            lambda upstream, asked, sent: upstream.complete(endpoint, asked, sent),
        )

    async def count_tokens(
        self,
        targets: Sequence[Target],
        body: dict[str, Any],
        headers: dict[str, str],
        scope: Stage = QUIET,
    ) -> tuple[Target, int, int]:
        """The chat body's input tokens, counted by the first target to answer, as it reads them."""
        return await self._ask_each(
            targets, body, headers, scope, lambda upstream, asked, sent: upstream.count_tokens(asked, sent)
        )

    def _ask_each(
        self,
        targets: Sequence[Target],
        body: dict[str, Any],
        headers: dict[str, str],
        scope: Stage,
        ask: Callable[[Upstream, dict[str, Any], dict[str, str]], Awaitable[T]],
    ) -> Coroutine[Any, Any, tuple[Target, T, int]]:
        """`ask` each target's upstream in turn (failing over), with `body` asking for the model
        that target serves."""

        async def attempt(target: Target, headers: dict[str, str]) -> T:
            return await ask(self._fleet.upstream_for(target), {**body, "model": target.model}, headers)

        model = targets[0].model if targets else ""
        # The failover's own coroutine, not one more awaiting it (every request comes here).
        return self._first_success(targets, attempt, headers, scope, model=model)

    async def open_stream(
        self,
        targets: Sequence[Target],
        endpoint: Endpoint,
        body: dict[str, Any],
        headers: dict[str, str],
        scope: Stage = QUIET,
    ) -> OpenedStream:
        """`body` goes to each target asking for the model that target serves."""

        async def attempt(
            target: Target, headers: dict[str, str]
        ) -> tuple[AsyncIterator[Chunk], Chunk, AsyncExitStack]:
            stack = AsyncExitStack()
            try:
                upstream = self._fleet.upstream_for(target)
                asked = {**body, "model": target.model}
                chunks = await stack.enter_async_context(upstream.stream(endpoint, asked, headers))
                first = await next_chunk(chunks, self._stream_idle_s)
                if first is None:
                    raise UpstreamError(f"{target.target_id} sent an empty stream", status_code=502)
            except BaseException:
                await run_shielded(stack.aclose, what=f"close failed stream to {target.target_id}")
                raise
            return chunks, first, stack

        target, (chunks, first, stack), attempts = await self._first_success(
            targets, attempt, headers, scope, model=targets[0].model if targets else ""
        )
        return OpenedStream(target=target, attempts=attempts, chunks=chunks, first=first, stack=stack)

    async def _first_success(
        self,
        targets: Sequence[Target],
        attempt: Attempt[T],
        headers: dict[str, str],
        scope: Stage,
        *,
        model: str,
    ) -> tuple[Target, T, int]:
        board = self._fleet.board
        failures: list[tuple[Target, UpstreamError]] = []
        # Clamped like the back-off schedule, so a large configured value cannot outrun it.
        max_attempts = min(self._retry.max_attempts, MAX_ATTEMPTS_BOUND)
        delays = backoff_delays(
            max_attempts, self._retry.backoff_base_s, self._retry.backoff_max_s, self._rng
        )
        tried = 0
        for target in targets:
            if tried >= max_attempts:
                break
            if board.refusal(target.target_id) is not None:
                continue
            if tried > 0:
                self._metrics.failovers.labels("retry").inc()
                await asyncio.sleep(delays[tried - 1])
            # Acquire after the back-off: a half-open target admits a bounded number of trials.
            permit = board.try_acquire(target.target_id)
            if isinstance(permit, Rejection):
                continue
            tried += 1
            try:
                outgoing = dict(headers)
                with scope.attempt(target, outgoing):  # observers may add traceparent
                    result = await attempt(target, outgoing)
            except BaseException as error:
                self._settle(target, permit, error)
                if not isinstance(error, UpstreamError):
                    raise
                self._count(target, "retryable" if error.retryable else "rejected")
                if not error.retryable:
                    raise UpstreamRejected(error) from None
                failures.append((target, error))
                continue
            board.record(target.target_id, permit, Outcome.SUCCESS)
            self.record_success(target)
            return target, result, tried
        raise UpstreamsExhausted(model, failures)

    def _settle(self, target: Target, permit: Permit, error: BaseException) -> None:
        outcome, retry_after = verdict(error)
        self._fleet.board.record(target.target_id, permit, outcome, retry_after=retry_after)

    def _count(self, target: Target, outcome: str) -> None:
        self._metrics.labelled(
            self._metrics.upstream_attempts, target.target_id, target.region, outcome
        ).inc()

    def record_success(self, target: Target) -> None:
        """Count a successful attempt (its breaker heard the verdict with the attempt's permit)."""
        self._count(target, "ok")

    def record_failure(self, target: Target, error: UpstreamError, *, outcome: str | None = None) -> None:
        """A target failed after its attempt was recorded as a success (a stream broke midway):
        counted, and a failure on its breaker."""
        self._count(target, outcome or ("retryable" if error.retryable else "rejected"))
        self._fleet.board.record_break(target.target_id)

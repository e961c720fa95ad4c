"""The circuit breaker state machine for one target: pure, driven by an injected clock.

closed --(failure rate >= threshold over the rolling window, with enough calls)--> open
open --(cool-down elapsed)--> half-open
half-open --(enough probe successes)--> closed;  half-open --(a probe fails)--> open

Rate limiting (429) is kept apart from failures: it never trips the breaker, it only makes the
target unavailable until its Retry-After has passed ("throttled"). Times are wall-clock seconds
(the clock defaults to time.time) because open-until instants are shared between replicas.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.health.config import BreakerConfig

Clock = Callable[[], float]


class BreakerState(enum.IntEnum):
    # The values are the breaker-state gauge's values.
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Outcome(enum.Enum):
    SUCCESS = "success"  # the target answered (a client's 4xx counts: the target is alive)
    FAILURE = "failure"  # 5xx, timeout, connection error, broken stream
    RATE_LIMITED = "rate_limited"  # 429: respect Retry-After, never trips the breaker
    NEUTRAL = "neutral"  # no verdict (the client went away): just give the permit back


@dataclass(frozen=True)
class Permit:
    """Leave to make one call; hand it back with `record`."""

    probe: bool
    generation: int


@dataclass(frozen=True)
class Rejection:
    reason: Literal["open", "probing", "throttled"]
    until: float | None  # when the target may be tried again, when known


@dataclass
class _Bucket:
    epoch: int = -1
    calls: int = 0
    failures: int = 0
    rate_limited: int = 0


@dataclass(frozen=True)
class WindowStats:
    calls: int
    failures: int
    rate_limited: int


class CircuitBreaker:
    def __init__(self, config: BreakerConfig | None = None, clock: Clock = time.time) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._open_until = 0.0
        self._throttled_until = 0.0
        # Bumped whenever the breaker (re)opens, so outcomes of probes let through in an
        # earlier half-open episode cannot close or count against the current one.
        self._generation = 0
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._bucket_s = self.config.window_s / self.config.buckets
        self._buckets = [_Bucket() for _ in range(self.config.buckets)]

    # -- observation -------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() >= self._open_until:
            self._state = BreakerState.HALF_OPEN
            self._probes_in_flight = 0
            self._probe_successes = 0
        return self._state

    @property
    def open_until(self) -> float | None:
        return self._open_until if self.state is BreakerState.OPEN else None

    @property
    def throttled_until(self) -> float | None:
        return self._throttled_until if self._clock() < self._throttled_until else None

    def available(self) -> bool:
        """Whether routing should offer this target: not open and not throttled."""
        return self.state is not BreakerState.OPEN and self.throttled_until is None

    def window(self) -> WindowStats:
        live = self._live_buckets()
        return WindowStats(
            calls=sum(b.calls for b in live),
            failures=sum(b.failures for b in live),
            rate_limited=sum(b.rate_limited for b in live),
        )

    # -- calls -------------------------------------------------------------------------------

    def try_acquire(self) -> Permit | Rejection:
        state = self.state
        if state is BreakerState.OPEN:
            return Rejection("open", self._open_until)
        throttled = self.throttled_until
        if throttled is not None:
            return Rejection("throttled", throttled)
        if state is BreakerState.HALF_OPEN:
            if self._probes_in_flight >= self.config.half_open_probes:
                return Rejection("probing", None)
            self._probes_in_flight += 1
            return Permit(probe=True, generation=self._generation)
        return Permit(probe=False, generation=self._generation)

    def record(self, permit: Permit, outcome: Outcome, *, retry_after: float | None = None) -> None:
        """Account for a finished call. `retry_after` (seconds) goes with RATE_LIMITED."""
        now = self._clock()
        if outcome is Outcome.RATE_LIMITED:
            wait = retry_after if retry_after is not None else self.config.default_retry_after_s
            self._throttled_until = max(self._throttled_until, now + max(wait, 0.0))
        stale = permit.generation != self._generation
        if permit.probe:
            if not stale:
                self._record_probe(outcome, now)
            return
        if stale or self.state is not BreakerState.CLOSED or outcome is Outcome.NEUTRAL:
            return
        bucket = self._bucket(now)
        if outcome is Outcome.RATE_LIMITED:
            bucket.rate_limited += 1
            return
        bucket.calls += 1
        if outcome is Outcome.FAILURE:
            bucket.failures += 1
            stats = self.window()
            if (
                stats.calls >= self.config.min_calls
                and stats.failures >= self.config.failure_rate * stats.calls
            ):
                self._open(now + self.config.cooldown_s)

    def trip(self, until: float) -> None:
        """Open until `until` because someone else (another replica) saw the target fail."""
        if until <= self._clock():
            return
        if self.state is BreakerState.OPEN and until <= self._open_until:
            return
        self._open(until)

    def throttle(self, until: float) -> None:
        """Skip the target until `until` (a Retry-After seen by another replica)."""
        self._throttled_until = max(self._throttled_until, until)

    # -- internals ---------------------------------------------------------------------------

    def _record_probe(self, outcome: Outcome, now: float) -> None:
        self._probes_in_flight = max(self._probes_in_flight - 1, 0)
        if self._state is not BreakerState.HALF_OPEN:
            return
        if outcome is Outcome.FAILURE:
            self._open(now + self.config.cooldown_s)
        elif outcome is Outcome.SUCCESS:
            self._probe_successes += 1
            if self._probe_successes >= self.config.probe_successes:
                self._state = BreakerState.CLOSED
                self._generation += 1
                self._reset_window()

    def _open(self, until: float) -> None:
        self._state = BreakerState.OPEN
        self._open_until = until
        self._generation += 1
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._reset_window()

    def _epoch(self, now: float) -> int:
        return int(now // self._bucket_s)

    def _bucket(self, now: float) -> _Bucket:
        epoch = self._epoch(now)
        bucket = self._buckets[epoch % len(self._buckets)]
        if bucket.epoch != epoch:
            bucket.epoch, bucket.calls, bucket.failures, bucket.rate_limited = epoch, 0, 0, 0
        return bucket

    def _live_buckets(self) -> list[_Bucket]:
        oldest = self._epoch(self._clock()) - len(self._buckets) + 1
        return [b for b in self._buckets if b.epoch >= oldest]

    def _reset_window(self) -> None:
        for bucket in self._buckets:
            bucket.epoch = -1

"""The circuit breaker state machine for one target: pure, driven by an injected clock.

closed --(the opening rule fires: failure rate over a window, or failures in a row)--> open
open --(cool-down elapsed)--> half-open
half-open --(enough trial successes)--> closed;  half-open --(a trial fails)--> open, for longer

Nodes, commercial providers and the quota store all use it; only their BreakerConfig differs.
Rate limiting (429) is kept apart from failures: it never opens the breaker, it only makes the
target unavailable until its Retry-After has passed ("throttled"). Times are whatever the clock
says: wall-clock seconds (the default) where open-until instants are shared between replicas,
monotonic seconds where they never leave the process.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.health.config import BreakerConfig, ConsecutiveFailures, RollingWindow

Clock = Callable[[], float]


class BreakerState(enum.IntEnum):
    # The values are the breaker-state gauge's values.
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Outcome(enum.Enum):
    SUCCESS = "success"  # the target answered (a client's 4xx counts: the target is alive)
    FAILURE = "failure"  # 5xx, timeout, connection error, broken stream
    RATE_LIMITED = "rate_limited"  # 429: respect Retry-After, never opens the breaker
    NEUTRAL = "neutral"  # no verdict (the caller went away): just give the permit back


@dataclass(frozen=True)
class Permit:
    """Leave to make one call; hand it back with `record`."""

    probe: bool
    generation: int


@dataclass(frozen=True)
class Rejection:
    reason: Literal["open", "probing", "throttled"]
    until: float | None  # when the target may be tried again, when known


@dataclass(frozen=True)
class WindowStats:
    calls: int
    failures: int
    rate_limited: int


@dataclass
class _Bucket:
    epoch: int = -1
    calls: int = 0
    failures: int = 0
    rate_limited: int = 0


class _Window:
    """RollingWindow's evidence: calls and failures per time slot."""

    success_closes = False  # calls from before an opening say nothing about the new episode

    def __init__(self, rule: RollingWindow) -> None:
        self._rule = rule
        self._bucket_s = rule.window_s / rule.buckets
        self._buckets = [_Bucket() for _ in range(rule.buckets)]

    def count(self, outcome: Outcome, now: float) -> bool:
        """Count a closed-state call; True when the breaker must open."""
        bucket = self._bucket(now)
        if outcome is Outcome.RATE_LIMITED:
            bucket.rate_limited += 1
            return False
        bucket.calls += 1
        return outcome is Outcome.FAILURE and self._failed(bucket, now)

    def count_break(self, now: float) -> bool:
        """A call counted as a success failed after all: one more failure, no more calls."""
        return self._failed(self._bucket(now), now)

    def _failed(self, bucket: _Bucket, now: float) -> bool:
        bucket.failures += 1
        stats = self.stats(now)
        return stats.calls >= self._rule.min_calls and stats.failures >= self._rule.failure_rate * stats.calls

    def stats(self, now: float) -> WindowStats:
        oldest = self._epoch(now) - len(self._buckets) + 1
        live = [b for b in self._buckets if b.epoch >= oldest]
        return WindowStats(
            calls=sum(b.calls for b in live),
            failures=sum(b.failures for b in live),
            rate_limited=sum(b.rate_limited for b in live),
        )

    def reset(self) -> None:
        for bucket in self._buckets:
            bucket.epoch = -1

    def _epoch(self, now: float) -> int:
        return int(now // self._bucket_s)

    def _bucket(self, now: float) -> _Bucket:
        epoch = self._epoch(now)
        bucket = self._buckets[epoch % len(self._buckets)]
        if bucket.epoch != epoch:
            bucket.epoch, bucket.calls, bucket.failures, bucket.rate_limited = epoch, 0, 0, 0
        return bucket


class _Streak:
    """ConsecutiveFailures' evidence: failures since the last success."""

    success_closes = True  # the latest answer wins, even from a call started before an opening

    def __init__(self, rule: ConsecutiveFailures) -> None:
        self._rule = rule
        self._calls = self._failures = self._rate_limited = 0

    def count(self, outcome: Outcome, now: float) -> bool:
        if outcome is Outcome.RATE_LIMITED:
            self._rate_limited += 1
            return False
        self._calls += 1
        if outcome is Outcome.SUCCESS:
            self._failures = 0
            return False
        return self.count_break(now)

    def count_break(self, now: float) -> bool:
        self._failures += 1
        return self._failures >= self._rule.failures

    def stats(self, now: float) -> WindowStats:
        return WindowStats(calls=self._calls, failures=self._failures, rate_limited=self._rate_limited)

    def reset(self) -> None:
        self._calls = self._failures = self._rate_limited = 0


class CircuitBreaker:
    def __init__(self, config: BreakerConfig | None = None, clock: Clock = time.time) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        opens = self.config.opens
        self._evidence = _Window(opens) if isinstance(opens, RollingWindow) else _Streak(opens)
        self._state = BreakerState.CLOSED
        self._open_until = 0.0
        self._throttled_until = 0.0
        self._openings = 0  # in a row, without closing in between: sets the cool-down
        # Bumped whenever the breaker opens or closes, so outcomes of calls let through in an
        # earlier episode cannot close it or count against the current one.
        self._generation = 0
        self._probes_in_flight = 0
        self._probe_successes = 0

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

    def refusal(self) -> Rejection | None:
        """Why a call would be refused now; None if one may go ahead."""
        state = self.state
        if state is BreakerState.OPEN:
            return Rejection("open", self._open_until)
        throttled = self.throttled_until
        if throttled is not None:
            return Rejection("throttled", throttled)
        if state is BreakerState.HALF_OPEN and self._probes_in_flight >= self.config.half_open_probes:
            return Rejection("probing", None)
        return None

    def available(self) -> bool:
        """Whether routing should offer this target: a call to it would be let through now."""
        return self.refusal() is None

    def retry_after_s(self) -> float:
        """Roughly how long until a call may be let through again (0 when one may now)."""
        refusal = self.refusal()
        if refusal is None or refusal.until is None:
            return 0.0
        return max(0.0, refusal.until - self._clock())

    def window(self) -> WindowStats:
        """The evidence the opening rule is looking at."""
        return self._evidence.stats(self._clock())

    # -- calls -------------------------------------------------------------------------------

    def try_acquire(self) -> Permit | Rejection:
        refusal = self.refusal()
        if refusal is not None:
            return refusal
        if self._state is BreakerState.HALF_OPEN:
            self._probes_in_flight += 1
            return Permit(probe=True, generation=self._generation)
        return Permit(probe=False, generation=self._generation)

    def record(self, permit: Permit, outcome: Outcome, *, retry_after: float | None = None) -> None:
        """Account for a finished call. `retry_after` (seconds) goes with RATE_LIMITED."""
        now = self._clock()
        if outcome is Outcome.RATE_LIMITED:
            wait = retry_after if retry_after is not None else self.config.default_retry_after_s
            self._throttled_until = max(self._throttled_until, now + max(wait, 0.0))
        current = permit.generation == self._generation
        if permit.probe and current:
            self._record_probe(outcome, now)
        elif current and self.state is BreakerState.CLOSED:
            if outcome is not Outcome.NEUTRAL and self._evidence.count(outcome, now):
                self._open(now)
        elif outcome is Outcome.SUCCESS and self._evidence.success_closes:
            if self.state is BreakerState.CLOSED:
                self._evidence.count(outcome, now)  # closed already: keep current permits current
            else:
                self._close()

    def record_break(self) -> None:
        """A call already recorded as a success failed after all (a stream broke midway)."""
        now = self._clock()
        if self.state is BreakerState.CLOSED and self._evidence.count_break(now):
            self._open(now)

    def trip(self, until: float) -> None:
        """Open until `until` because someone else (another replica) saw the target fail."""
        if until <= self._clock():
            return
        if self.state is BreakerState.OPEN:
            self._open_until = max(self._open_until, until)  # never shortened
            return
        self._openings += 1
        self._set_open(until)

    def throttle(self, until: float) -> None:
        """Skip the target until `until` (a Retry-After seen by another replica)."""
        self._throttled_until = max(self._throttled_until, until)

    # -- internals ---------------------------------------------------------------------------

    def _record_probe(self, outcome: Outcome, now: float) -> None:
        self._probes_in_flight = max(self._probes_in_flight - 1, 0)
        if self._state is not BreakerState.HALF_OPEN:
            return
        if outcome is Outcome.FAILURE:
            self._open(now)
        elif outcome is Outcome.SUCCESS:
            self._probe_successes += 1
            if self._probe_successes >= self.config.probe_successes:
                self._close()

    def _close(self) -> None:
        self._state = BreakerState.CLOSED
        self._generation += 1
        self._openings = 0
        self._probes_in_flight = 0
        self._evidence.reset()

    def _open(self, now: float) -> None:
        self._openings += 1
        self._set_open(now + self.config.cooldown.after(self._openings))

    def _set_open(self, until: float) -> None:
        self._state = BreakerState.OPEN
        self._open_until = until
        self._generation += 1
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._evidence.reset()

"""Settings of one circuit breaker: when it opens, how long it stays open, how it probes back.

Two opening rules, one per kind of evidence: a failure rate over a rolling window (commercial
providers, busy enough that one error means little) and a run of consecutive failures (nodes and
the quota store, where one failed call is reason enough to stop sending, "passive ejection").
The cool-down is `base_s`, doubling with each opening in a row up to `max_s` (without `max_s`,
a fixed cool-down). Every breaker, whatever its rules, goes closed -> open -> half-open.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _check(settings: object, checks: dict[str, bool]) -> None:
    for name, ok in checks.items():
        if not ok:
            raise ValueError(f"{name}: invalid value {getattr(settings, name)!r}")


@dataclass(frozen=True)
class RollingWindow:
    """Open when failures / calls >= `failure_rate` over the last `window_s` seconds (cut into
    `buckets` slots), once the window holds at least `min_calls` calls, so one unlucky request on
    a quiet target does not open it."""

    failure_rate: float = 0.5
    min_calls: int = 5
    window_s: float = 30.0
    buckets: int = 10

    def __post_init__(self) -> None:
        _check(
            self,
            {
                "failure_rate": 0.0 < self.failure_rate <= 1.0,
                "min_calls": self.min_calls >= 1,
                "window_s": self.window_s > 0,
                "buckets": self.buckets >= 1,
            },
        )


@dataclass(frozen=True)
class ConsecutiveFailures:
    """Open after `failures` failed calls in a row; any success in between starts the count over.
    The latest answer wins: a success closes the breaker even from a call that started before it
    opened (the target answered after all)."""

    failures: int = 1

    def __post_init__(self) -> None:
        _check(self, {"failures": self.failures >= 1})


@dataclass(frozen=True)
class Cooldown:
    """How long an opening lasts: `base_s` for the first, doubling for each further opening in a
    row (a failed half-open trial), at most `max_s` (None: `base_s`, a fixed cool-down)."""

    base_s: float
    max_s: float | None = None

    def __post_init__(self) -> None:
        _check(self, {"base_s": self.base_s >= 0, "max_s": self.max_s is None or self.max_s >= self.base_s})

    def after(self, openings: int) -> float:
        """The cool-down of the `openings`-th opening in a row (1 for the first)."""
        longest = self.base_s if self.max_s is None else self.max_s
        return min(longest, self.base_s * 2.0 ** min(openings - 1, 64))  # capped: no overflow


@dataclass(frozen=True)
class BreakerConfig:
    opens: RollingWindow | ConsecutiveFailures = field(default_factory=RollingWindow)
    cooldown: Cooldown = field(default_factory=lambda: Cooldown(15.0))  # open -> half-open
    half_open_probes: int = 1  # concurrent trial calls let through while half-open
    probe_successes: int = 1  # successful trials that close the breaker
    default_retry_after_s: float = 1.0  # how long a 429 without Retry-After takes a target out

    def __post_init__(self) -> None:
        _check(
            self,
            {
                "half_open_probes": self.half_open_probes >= 1,
                "probe_successes": self.probe_successes >= 1,
                "default_retry_after_s": self.default_retry_after_s >= 0,
            },
        )


def ejection(base_s: float, max_s: float) -> BreakerConfig:
    """Passive ejection, the nodes' policy: one failure opens the breaker for `base_s`, doubling
    with each failed trial up to `max_s`; then a single trial call decides."""
    return BreakerConfig(opens=ConsecutiveFailures(1), cooldown=Cooldown(base_s, max_s))

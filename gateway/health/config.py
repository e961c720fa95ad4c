"""Settings of one circuit breaker, shared by every target it guards."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BreakerConfig:
    """When a target's breaker opens, how long it stays open and how it probes its way back.

    The failure rate is measured over a rolling window of `window_s` seconds cut into
    `buckets` slots, and only once the window holds at least `min_calls` calls, so one unlucky
    request on a quiet target does not open it.
    """

    failure_rate: float = 0.5  # open when failures / calls >= this
    min_calls: int = 5
    window_s: float = 30.0
    buckets: int = 10
    cooldown_s: float = 15.0  # open -> half-open
    half_open_probes: int = 1  # concurrent probe calls let through while half-open
    probe_successes: int = 1  # successful probes that close the breaker
    default_retry_after_s: float = 1.0  # how long a 429 without Retry-After takes a target out

    def __post_init__(self) -> None:
        checks = {
            "failure_rate": 0.0 < self.failure_rate <= 1.0,
            "min_calls": self.min_calls >= 1,
            "window_s": self.window_s > 0,
            "buckets": self.buckets >= 1,
            "cooldown_s": self.cooldown_s >= 0,
            "half_open_probes": self.half_open_probes >= 1,
            "probe_successes": self.probe_successes >= 1,
            "default_retry_after_s": self.default_retry_after_s >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")

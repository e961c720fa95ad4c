"""Bounded load shapes for the drills: every shape ends by itself."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

from locust import LoadTestShape


def poisson_throughput(rate_per_s: float) -> Callable[[Any], float]:
    """A locust `wait_time` for Poisson arrivals at `rate_per_s` per user: each user's requests
    start at exponentially distributed intervals from a random phase, the way independent people
    arrive. (`constant_throughput` keeps every user spawned in one instant on the same beat, so a
    spike of 100 users becomes a burst of 100 requests within a millisecond every period: a
    thundering herd, not 20x the arrival rate.) A request that runs past its slot starts the next
    at once, as constant_throughput does, without borrowing the lost time back."""

    def wait_time(user: Any) -> float:
        now = time.monotonic()
        due = getattr(user, "_next_arrival", None)
        due = max(due if due is not None else now, now) + random.expovariate(rate_per_s)
        user._next_arrival = due
        return due - now

    return wait_time


def arrival_phase(user: Any) -> None:
    """Call from a user's `on_start`: wait a random part of its first interval, so users spawned
    together (the spike's) do not all send their first request in the same instant."""
    import gevent  # locust's runtime; imported here so the module loads without it

    rate = getattr(user, "arrival_rate_per_s", 1.0)
    gevent.sleep(random.uniform(0, 1 / rate))


class SpikeShape(LoadTestShape):
    """Baseline, a sudden spike of users, then recovery; stops after the last stage.

    Stage lengths and user counts come from MERIDIAN_SPIKE (baseline,spike,seconds) so the
    drill can be scaled to the machine without editing code.
    """

    def __init__(self) -> None:
        super().__init__()
        baseline, spike, seconds = (int(x) for x in os.environ.get("MERIDIAN_SPIKE", "4,32,20").split(","))
        # (end time in seconds, users, spawn rate)
        self.stages = [
            (seconds, baseline, baseline),
            (2 * seconds, spike, spike),  # spawn the whole spike at once
            (3 * seconds, baseline, spike),
        ]

    def tick(self) -> tuple[int, float] | None:
        elapsed = self.get_run_time()
        for end, users, rate in self.stages:
            if elapsed < end:
                return users, rate
        return None


class SpikeDrillShape(LoadTestShape):
    """The overload drill (loadtests/spike_drill.py): `baseline` users for `before_s`, 20x as many
    for `spike_s` (spawned at once), `baseline` again for `after_s`, then stop. Users pace
    themselves at a constant arrival rate, so 20x the users is 20x the arrival rate."""

    def __init__(
        self, baseline: int = 5, before_s: float = 60, spike_s: float = 60, after_s: float = 60
    ) -> None:
        super().__init__()
        self.spike_start_s = before_s
        self.spike_end_s = before_s + spike_s
        self.end_s = self.spike_end_s + after_s
        spike = 20 * baseline
        # (end time in seconds, users, spawn rate)
        self.stages = [
            (before_s, baseline, baseline),
            (self.spike_end_s, spike, spike),
            (self.end_s, baseline, spike),
        ]

    def tick(self) -> tuple[int, float] | None:
        elapsed = self.get_run_time()
        for end, users, rate in self.stages:
            if elapsed < end:
                return users, rate
        return None

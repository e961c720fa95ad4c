"""Bounded load shapes for the drills: every shape ends by itself."""

from __future__ import annotations

import os

from locust import LoadTestShape


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

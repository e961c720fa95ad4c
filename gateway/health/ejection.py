"""Passive ejection: a node that fails real requests is taken out of routing for a while.

Each failure (connect error, timeout, 5xx) doubles the node's time out, from `base_s` up to
`max_s`. When the time is up the node is half-open: exactly one request may try it (the trial);
success readmits it, failure ejects it again for twice as long. Pure state with an injected clock,
so the schedule is unit-tested without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Ejection:
    failures: int
    until: float
    trial_in_flight: bool = False


class Ejections:
    def __init__(self, *, base_s: float, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        assert 0 < base_s <= max_s, "ejection needs 0 < base_s <= max_s"
        self._base_s = base_s
        self._max_s = max_s
        self._clock = clock
        self._state: dict[str, _Ejection] = {}

    def available(self, node_id: str) -> bool:
        """Whether routing may list the node now (healthy, or half-open with no trial running)."""
        state = self._state.get(node_id)
        if state is None:
            return True
        return self._clock() >= state.until and not state.trial_in_flight

    def try_acquire(self, node_id: str) -> bool:
        """Called just before an attempt; False means skip the node (ejected, or its trial is taken)."""
        state = self._state.get(node_id)
        if state is None:
            return True
        if self._clock() < state.until or state.trial_in_flight:
            return False
        state.trial_in_flight = True
        return True

    def record_success(self, node_id: str) -> None:
        self._state.pop(node_id, None)

    def record_failure(self, node_id: str) -> float:
        """Eject the node; returns how long it is out."""
        state = self._state.get(node_id)
        failures = state.failures + 1 if state is not None else 1
        backoff = min(self._max_s, self._base_s * 2 ** (failures - 1))
        self._state[node_id] = _Ejection(failures=failures, until=self._clock() + backoff)
        return backoff

    def release(self, node_id: str) -> None:
        """An attempt ended with no verdict on the node (e.g. the client went away)."""
        state = self._state.get(node_id)
        if state is not None:
            state.trial_in_flight = False

    def ejected(self) -> dict[str, float]:
        """Node ids currently out, with seconds left."""
        now = self._clock()
        return {node_id: s.until - now for node_id, s in self._state.items() if s.until > now}

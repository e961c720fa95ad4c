"""When to skip the shared store: a small circuit breaker with a single probe after a cool-down.

After a failure, calls skip Redis for `cooldown_s` (they go straight to the tenant's fail_mode,
so nobody waits on a dead Redis); then exactly one call probes it while the others keep
skipping, and the probe's result closes or re-opens the breaker. This is how the gateway goes
back to Redis by itself once it returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "probing"]


class StoreBreaker:
    def __init__(self, cooldown_s: float, *, clock: Callable[[], float] = time.monotonic):
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._state: BreakerState = "closed"
        self._opened_at = 0.0

    @property
    def state(self) -> BreakerState:
        return self._state

    def allow(self) -> bool:
        """May this call go to the store? Every True must be followed by exactly one of
        success(), failure() or abandon()."""
        if self._state == "closed":
            return True
        if self._state == "open" and self._clock() - self._opened_at >= self._cooldown_s:
            self._state = "probing"
            return True
        return False

    def success(self) -> None:
        self._state = "closed"

    def failure(self) -> None:
        self._state = "open"
        self._opened_at = self._clock()

    def abandon(self) -> None:
        """The call ended without an answer either way (e.g. cancelled): let another call probe."""
        if self._state == "probing":
            self._state = "open"

    def retry_after_s(self) -> float:
        """Roughly when the store will be tried again."""
        if self._state == "closed":
            return 0.0
        return max(0.0, self._cooldown_s - (self._clock() - self._opened_at))

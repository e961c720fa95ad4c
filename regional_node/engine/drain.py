"""How fast an engine works through its tokens: prompt and generated tokens per second, lately.

A sliding window over the steps that ended in the last `window_s` seconds: the tokens they
computed (prefill chunks plus one per decode: the step's batched tokens), divided by the time from
the start of the oldest of them to now. The rate is computed when read, never cached, so it stays
honest however the engine is used:
- going idle, its steps age out of the window and the rate falls to 0 within `window_s`, instead
  of reporting the last busy moment forever;
- busy again after an idle spell, the span starts at the first new step, so the first steps of a
  burst give the real rate rather than one diluted by the idle time before them;
- idle gaps between steps inside the window do count: it is throughput, what a queue behind the
  engine actually sees, not the speed of one step.

Thread-safe: the step thread records, any thread reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

# Long enough to smooth the difference between prefill-heavy and decode-only steps, short enough
# to follow a change of load within a few of the gateway's /load probes.
DRAIN_WINDOW_S = 5.0


class DrainMeter:
    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._steps: deque[tuple[float, float, int]] = deque()  # (start, end, tokens), oldest first
        self._tokens = 0
        self._lock = threading.Lock()

    def record(self, start: float, end: float, tokens: int) -> None:
        """One step that computed `tokens` tokens between `start` and `end` (the clock's time)."""
        with self._lock:
            self._steps.append((start, end, tokens))
            self._tokens += tokens
            self._prune(end)

    def rate(self) -> float:
        """Tokens per second over the window; 0.0 when no step ended within it."""
        now = self._clock()
        with self._lock:
            self._prune(now)
            if not self._steps:
                return 0.0
            span = now - self._steps[0][0]
            return self._tokens / span if span > 0 else 0.0

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        steps = self._steps
        while steps and steps[0][1] < horizon:
            self._tokens -= steps.popleft()[2]

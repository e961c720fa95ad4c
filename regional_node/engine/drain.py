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

It also keeps the duration of the last few steps (`step_time_s`): how long the *next* step will
take is best guessed from the latest ones, since a step's cost follows the batch, which a spike
changes within a second (the 5 s window would lag it).

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
# Steps averaged for the current step time: enough to smooth one prefill-heavy step, few enough to
# follow a batch that grows by a request or two per step.
RECENT_STEPS = 8


class DrainMeter:
    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        # (start, end, tokens, requests finished), oldest first
        self._steps: deque[tuple[float, float, int, int]] = deque()
        self._tokens = 0
        self._finished = 0
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT_STEPS)  # (end, duration)
        self._lock = threading.Lock()

    def record(self, start: float, end: float, tokens: int, finished: int = 0) -> None:
        """One step that computed `tokens` tokens between `start` and `end` (the clock's time) and
        finished `finished` requests."""
        with self._lock:
            self._steps.append((start, end, tokens, finished))
            self._tokens += tokens
            self._finished += finished
            self._recent.append((end, max(end - start, 0.0)))
            self._prune(end)

    def rate(self) -> float:
        """Tokens per second over the window; 0.0 when no step ended within it."""
        return self._per_second()[0]

    def finish_rate(self) -> float:
        """Requests finished per second over the window (how fast running ones free their slots)."""
        return self._per_second()[1]

    def _per_second(self) -> tuple[float, float]:
        now = self._clock()
        with self._lock:
            self._prune(now)
            if not self._steps:
                return 0.0, 0.0
            span = now - self._steps[0][0]
            if span <= 0:
                return 0.0, 0.0
            return self._tokens / span, self._finished / span

    def step_time_s(self) -> float:
        """Mean duration of the last RECENT_STEPS steps that ended within the window; 0.0 when none
        did (an idle engine's next step is a small one, and its old steps say nothing about it)."""
        horizon = self._clock() - self.window_s
        with self._lock:
            recent = [duration for end, duration in self._recent if end >= horizon]
        return sum(recent) / len(recent) if recent else 0.0

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        steps = self._steps
        while steps and steps[0][1] < horizon:
            _, _, tokens, finished = steps.popleft()
            self._tokens -= tokens
            self._finished -= finished

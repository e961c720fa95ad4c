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

It also fits what a step costs for its batch (`step_cost`: protocol/first_token.py's StepCost,
duration = base + per-token cost * batched tokens) over recent steps of every size: a few steps
per size band are kept however long ago they ran, so a long decode-only spell does not forget
what a prefill step costs, and an idle spell does not forget anything. Each band counts by its
median step and the line is Theil-Sen's, so a stalled step (one that waited seconds for a core)
tilts neither. This is what the time-to-first-token estimate runs the next steps at; a
throughput averaged over a window (`rate`) says nothing after an idle spell, and charges a burst
of prompts as if they were processed one token at a time.

The finish rate (requests per second freeing sequence slots) is kept likewise: `slot_rate`
is the window's, or the last one measured while busy.

Thread-safe: the step thread records, any thread reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from protocol.first_token import StepCost

# Long enough to smooth the difference between prefill-heavy and decode-only steps, short enough
# to follow a change of load within a few of the gateway's /load probes.
DRAIN_WINDOW_S = 5.0
# Steps kept per size band (batched tokens 1, 2-3, 4-7, ...) for the step-cost fit: enough to
# smooth one noisy step, few enough to follow a machine whose speed changes (another process
# takes a core) within a few steps of each size.
STEPS_PER_BAND = 8
# The least spread of batched tokens (largest minus smallest) that can tell a per-token cost from
# noise; below it the fit is the median step time.
MIN_TOKEN_SPREAD = 8


class DrainMeter:
    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        # (start, end, tokens, requests finished), oldest first
        self._steps: deque[tuple[float, float, int, int]] = deque()
        self._tokens = 0
        self._finished = 0
        # By size band (tokens.bit_length()): the latest (tokens, duration) steps of that size.
        self._bands: dict[int, deque[tuple[int, float]]] = {}
        self._busy_finish_rate = 0.0
        self._lock = threading.Lock()

    def record(self, start: float, end: float, tokens: int, finished: int = 0) -> None:
        """One step that computed `tokens` tokens between `start` and `end` (the clock's time) and
        finished `finished` requests."""
        with self._lock:
            self._steps.append((start, end, tokens, finished))
            self._tokens += tokens
            self._finished += finished
            if tokens > 0 and end > start:  # a step of unknown length (stats.py) says nothing of its cost
                band = self._bands.setdefault(tokens.bit_length(), deque(maxlen=STEPS_PER_BAND))
                band.append((tokens, max(end - start, 0.0)))
            self._prune(end)
        if finished:
            self._busy_finish_rate = self.finish_rate() or self._busy_finish_rate

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

    def slot_rate(self) -> float:
        """Requests finished per second: the window's, or the last rate measured while requests
        were finishing (an idle engine frees slots as fast as it last did); 0.0 before any."""
        return self.finish_rate() or self._busy_finish_rate

    def step_cost(self) -> StepCost:
        """A step's duration by its batched tokens, fitted on the kept steps (module docstring);
        StepCost() (unmeasured) before the first step."""
        with self._lock:
            bands = [list(band) for band in self._bands.values() if band]
        return fit_step_cost([_median_step(band) for band in bands])

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        steps = self._steps
        while steps and steps[0][1] < horizon:
            _, _, tokens, finished = steps.popleft()
            self._tokens -= tokens
            self._finished -= finished


def _median_step(steps: list[tuple[int, float]]) -> tuple[int, float]:
    """One size band's typical step: its median size and median duration. A lone stall (a step
    that waited seconds for a core) moves a median by one place, never to itself, where it would
    drag a mean, and a fitted cost with it, for as long as it is kept."""
    return round(_median([t for t, _ in steps])), _median([d for _, d in steps])


def fit_step_cost(points: list[tuple[int, float]]) -> StepCost:
    """The line `duration = base + per_token * tokens` through (tokens, duration) points, by
    Theil-Sen (the median of the pairwise slopes, then the median intercept): one stalled band
    cannot tilt it, as it would a least-squares line. Both coefficients are kept non-negative: the
    median duration as `base` when the sizes barely vary or bigger steps ran no slower (noise),
    a line through the origin where the intercept would be negative."""
    if not points:
        return StepCost()
    tokens = [t for t, _ in points]
    if max(tokens) - min(tokens) < MIN_TOKEN_SPREAD:
        return StepCost(base_s=_median([d for _, d in points]))
    slopes = [
        (d2 - d1) / (t2 - t1) for i, (t1, d1) in enumerate(points) for t2, d2 in points[i + 1 :] if t2 != t1
    ]
    per_token = _median(slopes)
    if per_token <= 0:
        return StepCost(base_s=_median([d for _, d in points]))
    base = _median([d - per_token * t for t, d in points])
    if base < 0:
        return StepCost(per_token_s=_median([d / t for t, d in points]))
    return StepCost(base_s=base, per_token_s=per_token)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

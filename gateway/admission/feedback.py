"""What the estimates lately missed by: a pool's recent errors, added to its next estimates.

router/overload.py estimates a request's time to first token from the nodes' reports: a model of
the engine (slots, prefill steps, a step cost fitted per batch size). What the model leaves out
shows up in what followed: attention over long contexts that grows a step past its fitted cost,
a node's process starved of a core, the gateway's own event loop running late under load.
Measured on a saturated 2-core pool (benchmarks/admission.py), first tokens came up to 0.4 s
after their estimates at p90 while the median error was near zero: admission, trusting the
estimates, filled the pool up to the target and half of what it let in missed it.

So each pool (model, tier) keeps the errors of its recent estimates (observed TTFT minus the raw
estimate, at each first token; the last MAX_ERRORS within `window_s`), and admission adds their
QUANTILE to the raw estimate. Short estimates are kept apart from long ones (`short`: a prompt the
node starts beside its queue, router.overload.PoolWait.short): a cached prompt's one-step
estimate misses by tens of milliseconds where a cold 2,000-token prompt's misses by a share of a
second on a busy node, and one correction for both held every cached request back by the cold
prompts' misses (on three CPU nodes with 12 tenants, more than half the requests refused). Each
class's correction is thus: a request is let in when it would start within its target even if
this estimate misses like the worst tenth of the recent ones did. On a quiet pool the errors are
a few milliseconds either way, so the correction is too; with fewer than MIN_ERRORS recent errors
there is none. The corrected estimate never goes below zero.
"""

from __future__ import annotations

import math
from collections import deque

# The share of recent estimates whose error the correction covers.
QUANTILE = 0.9
# How many recent errors a pool keeps, and how long one counts: about the last few seconds of a
# busy pool, so a correction follows the load; a pool quiet for WINDOW_S is judged by its model.
MAX_ERRORS = 64
WINDOW_S = 30.0
MIN_ERRORS = 5


class EstimateFeedback:
    def __init__(self, *, window_s: float = WINDOW_S, quantile: float = QUANTILE) -> None:
        assert window_s > 0 and 0 < quantile <= 1
        self._window_s = window_s
        self._quantile = quantile
        self._errors: dict[tuple[str, str, bool], deque[tuple[float, float]]] = {}
        # Each admission asks for the correction (twice); it changes only when an error is
        # observed or the oldest one leaves the window: (correction, until when it holds).
        self._cached: dict[tuple[str, str, bool], tuple[float, float]] = {}

    def correction_s(self, model: str, tier: str, now: float, *, short: bool = False) -> float:
        """Seconds to add to the pool's raw estimates now (0 without enough recent errors)."""
        key = (model, tier, short)
        cached = self._cached.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        errors = self._recent(key, now)
        if len(errors) < MIN_ERRORS:
            correction = 0.0
        else:
            ordered = sorted(errors)
            correction = ordered[min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)]
        kept = self._errors.get(key)
        self._cached[key] = (correction, kept[0][0] + self._window_s if kept else math.inf)
        return correction

    def observe(self, model: str, tier: str, error_s: float, now: float, *, short: bool = False) -> None:
        """One first token came `error_s` after (negative: before) its raw estimate."""
        if math.isfinite(error_s):
            key = (model, tier, short)
            self._errors.setdefault(key, deque(maxlen=MAX_ERRORS)).append((now, error_s))
            self._cached.pop(key, None)

    def _recent(self, key: tuple[str, str, bool], now: float) -> list[float]:
        errors = self._errors.get(key)
        if errors is None:
            return []
        while errors and errors[0][0] < now - self._window_s:
            errors.popleft()
        return [error for _, error in errors]

"""The small model's confidence in its first tokens, and whether to escalate to the large tier.

Over the first K generated tokens' log-probabilities (what the engine returns per token):

    mean        = mean of the K logprobs
    window_min  = the lowest mean over any W consecutive tokens (W = min(window, K))
    score       = mean_weight * mean + (1 - mean_weight) * window_min

and the request escalates when `score < threshold`. The mean catches a model that is unsure
throughout; the window catches a confident opening followed by a stretch where it is lost, which
a mean over K would average away. Logprobs are floored at LOGPROB_FLOOR (a -inf from a masked
token would make every score -inf) and NaN counts as the floor. No tokens at all (the model ended
at once) is not evidence of doubt: no escalation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from router.types import EscalationOverrides

LOGPROB_FLOOR = -100.0
# Held-back tokens delay a stream's first byte: K is bounded in the gateway config and policies.
MAX_K_TOKENS = 256


@dataclass(frozen=True)
class ConfidenceRule:
    """The gateway config's `auto.escalation` (defaults) or a tenant's `escalation:` overrides."""

    threshold: float = -2.5  # escalate when the score is below this
    k_tokens: int = 8  # tokens judged (and, for streams, held back until the decision)
    window: int = 4  # W, the sliding window for window_min
    mean_weight: float = 0.5  # the mean's share of the score; the rest is window_min's

    def __post_init__(self) -> None:
        assert self.k_tokens >= 1 and self.window >= 1, "k_tokens and window must be at least 1"
        assert 0.0 <= self.mean_weight <= 1.0, "mean_weight is a share"


DEFAULT_RULE = ConfidenceRule()


def rule_for(default: ConfidenceRule, tenant: EscalationOverrides) -> ConfidenceRule:
    """The gateway's rule with the tenant's overrides applied (a window wider than K judges all K)."""
    given = {
        name: value
        for name, value in (
            ("threshold", tenant.threshold),
            ("k_tokens", tenant.k_tokens),
            ("window", tenant.window),
        )
        if value is not None
    }
    return replace(default, **given)


@dataclass(frozen=True)
class Confidence:
    escalate: bool
    score: float
    mean: float
    window_min: float
    tokens: int  # how many logprobs were judged (at most k_tokens)
    # `low_confidence=score:-3.21<-2.50,mean:-2.10,min4:-4.32` or `confident=score:-0.80>=-2.50`:
    # ASCII without `;` or spaces, for `x-meridian-route: auto:small→large;<reason>`.
    reason: str


def window_minimum(logprobs: Sequence[float], window: int) -> float:
    """The lowest mean over `window` consecutive values (the whole sequence when shorter)."""
    width = min(window, len(logprobs))
    total = sum(logprobs[:width])
    lowest = total
    for i in range(width, len(logprobs)):
        total += logprobs[i] - logprobs[i - width]
        lowest = min(lowest, total)
    return lowest / width


def judge(logprobs: Sequence[float], rule: ConfidenceRule = DEFAULT_RULE) -> Confidence:
    """Escalate or not, on the first `rule.k_tokens` logprobs (fewer when the answer is shorter)."""
    values = [_floored(x) for x in logprobs[: rule.k_tokens]]
    if not values:
        return Confidence(False, 0.0, 0.0, 0.0, 0, "confident=no_tokens")
    mean = sum(values) / len(values)
    lowest = window_minimum(values, rule.window)
    score = rule.mean_weight * mean + (1.0 - rule.mean_weight) * lowest
    escalate = score < rule.threshold
    width = min(rule.window, len(values))
    if escalate:
        reason = (
            f"low_confidence=score:{score:.2f}<{rule.threshold:.2f},mean:{mean:.2f},min{width}:{lowest:.2f}"
        )
    else:
        reason = f"confident=score:{score:.2f}>={rule.threshold:.2f}"
    return Confidence(escalate, score, mean, lowest, len(values), reason)


def _floored(logprob: float) -> float:
    if math.isnan(logprob):
        return LOGPROB_FLOOR
    return max(float(logprob), LOGPROB_FLOOR)

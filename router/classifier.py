"""The request classifier for `model: "auto"`: request features → the tier to start on.

A linear score over features the gateway can see without a tokenizer (router/README.md, "The
classifier"): size (estimated prompt tokens, max_tokens), shape (conversation turns), content
(code, math, explicit reasoning asks) and the tenant (its traffic tier, and the share of its recent
`auto` requests the confidence cascade escalated, which the caller passes in as a plain number).
The large tier when the score reaches the threshold. Every contribution is bounded, so one huge
feature cannot hide the others and the reason names the features that decided.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from router.types import ModelTier, TrafficTier

# Content is judged on the end of the conversation: the newest turns say what is being asked, and
# a bounded scan keeps the cost per request flat however long the prompt is.
SCAN_CHARS = 4000

_CODE = re.compile(
    r"```|^\s*(?:def|class|import|from \S+ import|func|fn|public|private|#include|SELECT|CREATE TABLE)\b"
    r"|^\s*(?:while|for|if|elif|else|try|except|with|switch)\b[^\n]*[:{]\s*$"
    r"|[;{}]\s*$|=>|->|\b\w+\([^()]*\)\s*[:{]"
    r"|\b(?:python|javascript|typescript|rust|golang|java|c\+\+|sql|regex|function|compile|stack trace"
    r"|traceback|segfault|bug|refactor)\b",
    re.IGNORECASE | re.MULTILINE,
)
_MATH = re.compile(
    r"\d\s*[-+*/^=<>]\s*\d|\\(?:frac|sum|int|sqrt|prod|lim)\b|\$[^$\n]+\$"
    r"|[∑∫√≤≥≠π∞]|\b(?:equation|integral|derivative|probability|matrix|matrices|theorem|lemma"
    r"|polynomial|prime|modulo|algebra|calculus|geometry|solve for|eigen\w*|square root|irrational"
    r"|fraction|percent(?:age)?|divisible)\b",
    re.IGNORECASE,
)
_REASONING = re.compile(
    r"\bstep[- ]by[- ]step\b|\bprove\b|\bproof\b|\bexplain why\b|\bwhy (?:does|do|is|are|did)\b"
    r"|\bderive\b|\bjustify\b|\breason(?:ing)? (?:about|through)\b|\bthink (?:carefully|hard)\b"
    r"|\bcompare and contrast\b|\btrade-?offs?\b|\banaly[sz]e\b|\bplan\b.*\bsteps\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class EscalationHistory:
    """The tenant's recent `auto` traffic of this model family, as the gateway's thrash guard
    (gateway/escalation/thrash.py) measured it; plain values, so classifying stays pure."""

    # The share (0..1) of recent judged `auto` requests the confidence cascade escalated to the
    # large tier: a tenant whose traffic keeps escalating is better started there. 0 (or NaN)
    # while the guard has too few verdicts to tell.
    rate: float = 0.0
    # The rate went over the guard's limit: every `auto` request starts on the large tier until
    # the cool-down ends, whatever the classifier says.
    cooling_down: bool = False
    # This request is in the sampled share that starts small (and so is judged) even when the
    # rate alone would start it large: the rate is measured only on judged requests, so without
    # a sample a rate that sends everything large could never come down.
    judge_sample: bool = False


NO_HISTORY = EscalationHistory()


@dataclass(frozen=True)
class RequestFeatures:
    """What the classifier sees of one request. Text-derived flags come from `content_flags`."""

    prompt_tokens: int  # the gateway's estimate (bytes / 4 + per-message overhead)
    max_tokens: int | None  # None: not given and no tenant cap
    turns: int = 1  # user messages in the conversation (1 for a completion prompt)
    has_code: bool = False
    has_math: bool = False
    asks_reasoning: bool = False
    traffic_tier: TrafficTier = "interactive"
    history: EscalationHistory = field(default_factory=lambda: NO_HISTORY)


@dataclass(frozen=True)
class ClassifierWeights:
    """Each feature's contribution to the score; the defaults are documented in router/README.md.

    Size features count per 1000 tokens and are capped at `size_cap_k` thousand, turns are counted
    beyond the first and capped at `turns_cap`; flags add their weight when set.
    """

    bias: float = 0.0
    prompt_per_1k: float = 0.5
    max_tokens_per_1k: float = 0.4
    size_cap_k: float = 4.0
    extra_turn: float = 0.05
    turns_cap: int = 10
    code: float = 0.5
    math: float = 0.5
    reasoning: float = 0.6
    interactive: float = 0.1
    escalation_rate: float = 1.0
    threshold: float = 1.0  # the large tier when the score is at least this


DEFAULT_WEIGHTS = ClassifierWeights()


@dataclass(frozen=True)
class TierChoice:
    """Where an `auto` request starts, and why (`reason` is header-safe ASCII without `;`)."""

    tier: ModelTier
    reason: str
    score: float | None = None  # the classifier's score; None for the other rules
    # What decided, a closed set for metrics labels: classifier, length, thrash_cooldown,
    # judge_sample.
    rule: str = "classifier"


def content_flags(texts: Iterable[str]) -> tuple[bool, bool, bool]:
    """(has_code, has_math, asks_reasoning) over the last SCAN_CHARS characters of `texts`."""
    scanned = "\n".join(texts)[-SCAN_CHARS:]
    return (
        _CODE.search(scanned) is not None,
        _MATH.search(scanned) is not None,
        _REASONING.search(scanned) is not None,
    )


def contributions(features: RequestFeatures, weights: ClassifierWeights) -> dict[str, float]:
    """Each feature's share of the score, by name (zero shares included)."""
    cap = weights.size_cap_k
    rate = features.history.rate
    rate = min(max(rate, 0.0), 1.0) if rate == rate else 0.0  # NaN (no data) counts as none
    return {
        "prompt": weights.prompt_per_1k * min(max(features.prompt_tokens, 0) / 1000, cap),
        "max_tokens": weights.max_tokens_per_1k * min(max(features.max_tokens or 0, 0) / 1000, cap),
        "turns": weights.extra_turn * min(max(features.turns - 1, 0), weights.turns_cap),
        "code": weights.code if features.has_code else 0.0,
        "math": weights.math if features.has_math else 0.0,
        "reasoning": weights.reasoning if features.asks_reasoning else 0.0,
        "interactive": weights.interactive if features.traffic_tier == "interactive" else 0.0,
        "escalation_rate": weights.escalation_rate * rate,
    }


def classify(features: RequestFeatures, weights: ClassifierWeights = DEFAULT_WEIGHTS) -> TierChoice:
    """The tier to start on: large when bias + Σ contributions ≥ threshold, except for a request
    in the judge sample (`history.judge_sample`) that only the escalation rate pushed over: that
    one starts small, so the cascade judges it and the rate keeps being measured.

    The reason reads `classifier=1.10>=1.00(reasoning+0.60,math+0.50)`: the score, the comparison,
    and the (at most three) largest contributions; `judge_sample,classifier=...` for the sample.
    """
    parts = contributions(features, weights)
    score = weights.bias + sum(parts.values())
    large = score >= weights.threshold
    top = sorted(((v, k) for k, v in parts.items() if v > 0), reverse=True)[:3]
    why = ",".join(f"{name}+{value:.2f}" for value, name in top)
    comparison = ">=" if large else "<"
    reason = f"classifier={score:.2f}{comparison}{weights.threshold:.2f}" + (f"({why})" if why else "")
    if large and features.history.judge_sample:
        own = weights.bias + sum(v for k, v in parts.items() if k != "escalation_rate")
        if own < weights.threshold:
            return TierChoice("small", f"judge_sample,{reason}", score, rule="judge_sample")
    return TierChoice("large" if large else "small", reason, score)

"""The gateway config's `auto:` section: how `model: "auto"` starts, and when it escalates.

auto:
  rule: classifier            # or `length`: the rule before the classifier (router/tiers.py)
  classifier:                 # router/classifier.py; every weight defaults as documented there
    threshold: 1.0            # the large tier when the score is at least this
    weights: {prompt_per_1k: 0.5, max_tokens_per_1k: 0.4, code: 0.5, math: 0.5, reasoning: 0.6, ...}
  length: {large_above_tokens: 2048, interactive_long_output: 512}
  escalation:                 # router/confidence.py; a tenant's policy `escalation:` overrides these
    enabled: true             # the cascade (gateway/escalation/cascade.py); false: no escalation
    threshold: -2.5           # escalate when the confidence score is below this
    k_tokens: 8               # the first K tokens are judged (and held back on streams)
    window: 4                 # W of the sliding-window minimum
    mean_weight: 0.5
  thrash:                     # gateway/escalation/thrash.py
    window_s: 300
    max_rate: 0.5
    min_requests: 20
    cool_down_s: 120
  escalation_rate:            # the classifier's escalation_rate feature (gateway/escalation/thrash.py)
    half_life_s: 60           # a verdict's weight halves every this long
    min_judged: 5             # no rate until the verdicts' weights add up to this
    judge_share: 0.1          # of requests the rate alone would start large, this share starts small

Defined here rather than in gateway/config.py because the structs translate to router values
(`to_router()`), next to the guard that uses the thrash part, as quota/config.py does for quota.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.config_reader import Section
from gateway.escalation.thrash import RateRule, ThrashRule
from router.classifier import ClassifierWeights
from router.confidence import MAX_K_TOKENS, ConfidenceRule
from router.tiers import AutoPolicy, AutoRule

_DEFAULT_WEIGHTS = ClassifierWeights()
_DEFAULT_CONFIDENCE = ConfidenceRule()
_DEFAULT_THRASH = ThrashRule()
_DEFAULT_RATE = RateRule()

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]


class ClassifierWeightsSection(Section):
    bias: float = _DEFAULT_WEIGHTS.bias
    prompt_per_1k: float = _DEFAULT_WEIGHTS.prompt_per_1k
    max_tokens_per_1k: float = _DEFAULT_WEIGHTS.max_tokens_per_1k
    size_cap_k: Annotated[float, msgspec.Meta(gt=0)] = _DEFAULT_WEIGHTS.size_cap_k
    extra_turn: float = _DEFAULT_WEIGHTS.extra_turn
    turns_cap: Annotated[int, msgspec.Meta(ge=0)] = _DEFAULT_WEIGHTS.turns_cap
    code: float = _DEFAULT_WEIGHTS.code
    math: float = _DEFAULT_WEIGHTS.math
    reasoning: float = _DEFAULT_WEIGHTS.reasoning
    interactive: float = _DEFAULT_WEIGHTS.interactive
    escalation_rate: float = _DEFAULT_WEIGHTS.escalation_rate


class ClassifierSection(Section):
    threshold: float = _DEFAULT_WEIGHTS.threshold
    weights: ClassifierWeightsSection = msgspec.field(default_factory=ClassifierWeightsSection)

    def to_router(self) -> ClassifierWeights:
        return ClassifierWeights(**msgspec.structs.asdict(self.weights), threshold=self.threshold)


class LengthSection(Section):
    large_above_tokens: Annotated[int, msgspec.Meta(ge=0)] = AutoRule().large_above_tokens
    interactive_long_output: Annotated[int, msgspec.Meta(ge=0)] = AutoRule().interactive_long_output


class EscalationSection(Section):
    enabled: bool = True  # false: `auto` requests are served by the tier they start on
    threshold: float = _DEFAULT_CONFIDENCE.threshold
    k_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_K_TOKENS)] = _DEFAULT_CONFIDENCE.k_tokens
    window: PositiveInt = _DEFAULT_CONFIDENCE.window
    mean_weight: Share = _DEFAULT_CONFIDENCE.mean_weight

    def __post_init__(self) -> None:
        if self.window > self.k_tokens:
            raise ValueError("window: must be at most k_tokens")

    def to_router(self) -> ConfidenceRule:
        return ConfidenceRule(
            threshold=self.threshold, k_tokens=self.k_tokens, window=self.window, mean_weight=self.mean_weight
        )


class ThrashSection(Section):
    window_s: Seconds = _DEFAULT_THRASH.window_s
    max_rate: Share = _DEFAULT_THRASH.max_rate
    min_requests: PositiveInt = _DEFAULT_THRASH.min_requests
    cool_down_s: Seconds = _DEFAULT_THRASH.cool_down_s

    def to_rule(self) -> ThrashRule:
        return ThrashRule(**msgspec.structs.asdict(self))


class EscalationRateSection(Section):
    half_life_s: Seconds = _DEFAULT_RATE.half_life_s
    min_judged: Annotated[float, msgspec.Meta(ge=0)] = _DEFAULT_RATE.min_judged
    judge_share: Share = _DEFAULT_RATE.judge_share

    def to_rule(self) -> RateRule:
        return RateRule(**msgspec.structs.asdict(self))


class AutoConfig(Section):
    rule: Literal["classifier", "length"] = "classifier"
    classifier: ClassifierSection = msgspec.field(default_factory=ClassifierSection)
    length: LengthSection = msgspec.field(default_factory=LengthSection)
    escalation: EscalationSection = msgspec.field(default_factory=EscalationSection)
    thrash: ThrashSection = msgspec.field(default_factory=ThrashSection)
    escalation_rate: EscalationRateSection = msgspec.field(default_factory=EscalationRateSection)

    def to_router(self) -> AutoPolicy:
        return AutoPolicy(
            rule=self.rule,
            classifier=self.classifier.to_router(),
            length=AutoRule(**msgspec.structs.asdict(self.length)),
        )

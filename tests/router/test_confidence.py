"""The confidence score over the small model's first K logprobs, and the escalation verdict."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from router.confidence import LOGPROB_FLOOR, ConfidenceRule, judge, rule_for, window_minimum
from router.types import EscalationOverrides

RULE = ConfidenceRule(threshold=-2.5, k_tokens=8, window=4, mean_weight=0.5)


def test_a_confident_opening_is_served_by_the_small_model() -> None:
    verdict = judge([-0.1, -0.3, -0.2, -0.05, -0.4, -0.1, -0.2, -0.3], RULE)

    assert not verdict.escalate
    assert verdict.reason.startswith("confident=score:")


def test_an_unsure_opening_escalates_with_the_numbers_in_the_reason() -> None:
    verdict = judge([-3.0] * 8, RULE)

    assert verdict.escalate
    assert verdict.reason == "low_confidence=score:-3.00<-2.50,mean:-3.00,min4:-3.00"


def test_a_lost_stretch_escalates_even_when_the_mean_looks_fine() -> None:
    opening = [-0.1, -0.1, -0.1, -0.1, -5.0, -5.0, -5.0, -5.0]
    mean_only = ConfidenceRule(threshold=-2.6, mean_weight=1.0)

    assert not judge(opening, mean_only).escalate  # mean -2.55
    assert judge(opening, ConfidenceRule(threshold=-2.6)).escalate  # window minimum -5.0


def test_only_the_first_k_tokens_are_judged() -> None:
    verdict = judge([-0.1] * 8 + [-50.0] * 100, RULE)

    assert not verdict.escalate and verdict.tokens == 8


def test_a_short_answer_is_judged_on_what_there_is_and_no_answer_never_escalates() -> None:
    assert judge([-6.0, -6.0], RULE).escalate
    assert judge([-6.0, -6.0], RULE).reason.endswith("min2:-6.00")
    assert not judge([], RULE).escalate


def test_minus_infinity_and_nan_count_as_the_floor() -> None:
    verdict = judge([float("-inf"), float("nan")], ConfidenceRule(window=1))

    assert verdict.window_min == LOGPROB_FLOOR and math.isfinite(verdict.score)


def test_window_minimum_is_the_lowest_window_mean() -> None:
    assert window_minimum([-1, -2, -3, -4], 2) == -3.5
    assert window_minimum([-1, -2], 5) == -1.5


def test_a_tenant_overrides_the_gateway_defaults_field_by_field() -> None:
    rule = rule_for(RULE, EscalationOverrides(threshold=-1.0, window=2))

    assert rule == ConfidenceRule(threshold=-1.0, k_tokens=8, window=2, mean_weight=0.5)
    assert rule_for(RULE, EscalationOverrides()) == RULE


logprobs = st.lists(st.floats(min_value=-30, max_value=0, allow_nan=False), max_size=40)


@given(values=logprobs, k=st.integers(1, 16), window=st.integers(1, 16), weight=st.floats(0, 1))
def test_the_score_lies_between_the_window_minimum_and_the_mean(
    values: list[float], k: int, window: int, weight: float
) -> None:
    verdict = judge(values, ConfidenceRule(k_tokens=k, window=window, mean_weight=weight))

    if values:
        low, high = sorted((verdict.mean, verdict.window_min))
        assert low - 1e-9 <= verdict.score <= high + 1e-9
        assert verdict.window_min >= min(values[:k]) - 1e-9


@given(values=logprobs, drop=st.floats(min_value=0, max_value=20), index=st.integers(0, 39))
def test_a_less_likely_token_never_turns_escalation_off(values: list[float], drop: float, index: int) -> None:
    if not values:
        return
    i = index % len(values)
    worse = [*values[:i], max(values[i] - drop, LOGPROB_FLOOR), *values[i + 1 :]]

    assert judge(worse, RULE).escalate or not judge(values, RULE).escalate


@given(values=logprobs, threshold=st.floats(-30, 0))
def test_escalation_is_monotonic_in_the_threshold(values: list[float], threshold: float) -> None:
    lower = judge(values, ConfidenceRule(threshold=threshold))
    higher = judge(values, ConfidenceRule(threshold=threshold + 0.5))

    assert higher.escalate or not lower.escalate

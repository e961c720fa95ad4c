"""The request classifier: features of a request → the tier "auto" starts on, and why."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from router.classifier import (
    ClassifierWeights,
    EscalationHistory,
    RequestFeatures,
    classify,
    content_flags,
    contributions,
)

SHORT = RequestFeatures(prompt_tokens=12, max_tokens=64)


def features(text: str, **fields: object) -> RequestFeatures:
    code, math, reasoning = content_flags([text])
    base = RequestFeatures(prompt_tokens=len(text) // 4 + 4, max_tokens=128)
    return replace(base, has_code=code, has_math=math, asks_reasoning=reasoning, **fields)


def test_hi_with_a_long_max_tokens_starts_small() -> None:
    # The length rule sent this to the large tier: a big budget is not a hard question.
    assert classify(features("hi", max_tokens=600)).tier == "small"


def test_a_short_proof_request_starts_large() -> None:
    choice = classify(features("Prove that the square root of 2 is irrational, step by step."))

    assert choice.tier == "large"
    assert "reasoning" in choice.reason


def test_math_alone_or_code_alone_stays_small_but_together_with_reasoning_goes_large() -> None:
    assert classify(features("What is 17 * 23?")).tier == "small"
    assert classify(features("def add(a, b):\n    return a + b")).tier == "small"
    assert classify(features("Explain why this loop never ends:\nwhile True:\n    pass")).tier == "large"


def test_a_long_prompt_starts_large() -> None:
    assert classify(RequestFeatures(prompt_tokens=2100, max_tokens=None)).tier == "large"
    assert classify(RequestFeatures(prompt_tokens=1500, max_tokens=None)).tier == "small"


def test_a_tenant_whose_traffic_keeps_escalating_starts_large_sooner() -> None:
    code_question = features("Fix this python function: def f(x): return x +")
    calm = replace(code_question, history=EscalationHistory(rate=0.0))
    thrashing = replace(code_question, history=EscalationHistory(rate=0.6))

    assert classify(calm).tier == "small"
    assert classify(thrashing).tier == "large"


def test_content_flags_see_code_math_and_reasoning_asks() -> None:
    assert content_flags(["```python\nprint(1)\n```"]) == (True, False, False)
    assert content_flags(["Solve the equation x^2 = 4"]) == (False, True, False)
    assert content_flags(["Can you explain why the sky is blue?"]) == (False, False, True)
    assert content_flags(["Tell me a story about a cat."]) == (False, False, False)


def test_only_the_end_of_a_long_conversation_is_scanned() -> None:
    old_code = "def f():\n    return 1\n"
    chatter = "and then we talked about the weather " * 200

    assert content_flags([old_code, chatter]) == (False, False, False)


def test_weights_come_from_the_config() -> None:
    eager = ClassifierWeights(threshold=0.0)
    assert classify(SHORT, eager).tier == "large"
    assert classify(SHORT).tier == "small"


def test_reason_names_score_threshold_and_top_contributions() -> None:
    choice = classify(
        features("Prove it step by step: 3 + 4 = 7", traffic_tier="batch", prompt_tokens=0, max_tokens=None)
    )

    assert choice.reason.startswith("classifier=1.10>=1.00(")
    assert "reasoning+0.60" in choice.reason and "math+0.50" in choice.reason
    assert ";" not in choice.reason and " " not in choice.reason and choice.reason.isascii()


finite = st.floats(min_value=0, max_value=1, allow_nan=False)


@given(
    prompt=st.integers(0, 10**9),
    max_tokens=st.one_of(st.none(), st.integers(0, 10**9)),
    turns=st.integers(0, 10**6),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    rate=st.one_of(finite, st.just(float("nan")), st.floats(-5, 5)),
)
def test_every_contribution_is_bounded_whatever_the_request(
    prompt: int, max_tokens: int | None, turns: int, flags: tuple[bool, bool, bool], rate: float
) -> None:
    request = RequestFeatures(
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        turns=turns,
        has_code=flags[0],
        has_math=flags[1],
        asks_reasoning=flags[2],
        history=EscalationHistory(rate=rate),
    )
    weights = ClassifierWeights()
    parts = contributions(request, weights)

    assert parts["prompt"] <= weights.prompt_per_1k * weights.size_cap_k
    assert parts["max_tokens"] <= weights.max_tokens_per_1k * weights.size_cap_k
    assert parts["turns"] <= weights.extra_turn * weights.turns_cap
    assert 0 <= parts["escalation_rate"] <= weights.escalation_rate
    assert classify(request).score == sum(parts.values())


@given(prompt=st.integers(0, 10_000), more=st.integers(0, 10_000), max_tokens=st.integers(0, 10_000))
def test_a_longer_request_never_moves_down_a_tier(prompt: int, more: int, max_tokens: int) -> None:
    shorter = RequestFeatures(prompt_tokens=prompt, max_tokens=max_tokens)
    longer = replace(shorter, prompt_tokens=prompt + more)

    assert not (classify(shorter).tier == "large" and classify(longer).tier == "small")


def test_a_sampled_request_that_only_the_escalation_rate_sends_large_starts_small() -> None:
    plain = features("Name a colour.")
    pushed = replace(plain, history=EscalationHistory(rate=1.0))

    assert classify(pushed).tier == "large"
    sampled = classify(replace(pushed, history=EscalationHistory(rate=1.0, judge_sample=True)))
    assert (sampled.tier, sampled.rule) == ("small", "judge_sample")
    assert sampled.reason.startswith("judge_sample,classifier=1.") and ";" not in sampled.reason


def test_a_sampled_request_large_on_its_own_features_still_starts_large() -> None:
    proof = features("Prove that the square root of 2 is irrational, step by step.")
    sampled = replace(proof, history=EscalationHistory(rate=1.0, judge_sample=True))

    assert classify(sampled).tier == "large" and classify(sampled).rule == "classifier"


@given(rate=st.floats(0, 1), prompt=st.integers(0, 5000), flags=st.tuples(st.booleans(), st.booleans()))
def test_the_judge_sample_never_moves_a_request_up_a_tier(
    rate: float, prompt: int, flags: tuple[bool, bool]
) -> None:
    request = RequestFeatures(
        prompt_tokens=prompt,
        max_tokens=None,
        has_code=flags[0],
        has_math=flags[1],
        history=EscalationHistory(rate),
    )
    sampled = replace(request, history=EscalationHistory(rate, judge_sample=True))
    unrated = replace(request, history=EscalationHistory(0.0))

    assert classify(sampled).tier in {classify(request).tier, "small"}
    if classify(sampled).tier != classify(request).tier:
        assert classify(unrated).tier == "small"

"""The escalation rate the classifier reads (gateway/escalation/thrash.py): a statistic of judged
requests, with a minimum sample, decaying with time, and kept measured by a judged sample of the
requests it sends to the large tier. On a fake clock, with the real classifier."""

from __future__ import annotations

import math
from dataclasses import replace

from gateway.escalation.thrash import RateRule, ThrashGuard, ThrashRule
from router.classifier import (
    NO_HISTORY,
    EscalationHistory,
    RequestFeatures,
    TierChoice,
    classify,
    content_flags,
)

# The cool-down has its own tests (test_thrash.py); here it stays out of the way.
NO_COOL_DOWN = ThrashRule(min_requests=1_000_000)
PLAIN = "Name a colour."


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guard(rate: RateRule = RateRule(), thrash: ThrashRule = NO_COOL_DOWN) -> tuple[ThrashGuard, Clock]:
    clock = Clock()
    return ThrashGuard(thrash, clock, rate=rate), clock


def record(g: ThrashGuard, *outcomes: bool) -> None:
    for escalated in outcomes:
        g.record("acme", "small", escalated=escalated)


def start(text: str, history: EscalationHistory) -> TierChoice:
    """Where the gateway's plan would start an interactive `auto` request with this text."""
    code, math_, reasoning = content_flags([text])
    features = RequestFeatures(
        prompt_tokens=len(text) // 4 + 4,
        max_tokens=None,
        has_code=code,
        has_math=math_,
        asks_reasoning=reasoning,
        history=history,
    )
    return classify(features)


def test_one_escalation_does_not_send_the_tenants_next_requests_to_the_large_tier() -> None:
    # The ratchet: a rate of 1.0 after one escalation started every short prompt large, where it
    # was never judged, so the rate could not fall until the window ended.
    g, clock = guard()
    record(g, True)

    for _ in range(5):
        clock.now += 1.0
        assert start(PLAIN, g.history("acme", "small")).tier == "small"


def test_there_is_no_rate_until_the_judged_requests_reach_the_minimum() -> None:
    g, _ = guard(RateRule(min_judged=5))
    record(g, True, True, True, True)
    assert g.history("acme", "small") == NO_HISTORY

    record(g, True)

    assert g.history("acme", "small").rate == 1.0
    assert start(PLAIN, g.history("acme", "small")).tier == "large"


def test_the_rate_is_forgotten_when_no_request_is_judged_for_a_while() -> None:
    g, clock = guard(RateRule(half_life_s=60.0, min_judged=5))
    record(g, *[True] * 10)
    clock.now += 59.0
    assert g.history("acme", "small").rate == 1.0  # a weight of 10 * 2^(-59/60) is still over 5

    clock.now += 2.0  # 10 * 2^(-61/60) is under 5

    assert g.history("acme", "small") == NO_HISTORY


def test_newer_verdicts_outweigh_older_ones() -> None:
    g, clock = guard(RateRule(half_life_s=60.0, min_judged=5))
    record(g, *[True] * 10)
    clock.now += 180.0  # three half-lives: the ten escalations weigh 1.25
    record(g, *[False] * 10)

    assert math.isclose(g.history("acme", "small").rate, 1.25 / 11.25)


def test_a_share_of_the_requests_the_rate_sends_large_is_started_small_to_be_judged() -> None:
    g, _ = guard(RateRule(min_judged=5, judge_share=0.1))
    record(g, *[True] * 10)

    choices = [start(PLAIN, g.history("acme", "small", f"req-{i}")) for i in range(2000)]

    sampled = [c for c in choices if c.tier == "small"]
    assert 0.07 < len(sampled) / len(choices) < 0.13
    assert all(c.rule == "judge_sample" and c.reason.startswith("judge_sample,classifier=") for c in sampled)
    assert all(c.rule == "classifier" for c in choices if c.tier == "large")


def test_the_draw_is_the_same_for_the_same_request_id() -> None:
    g, _ = guard(RateRule(min_judged=1, judge_share=0.5))
    record(g, True)

    first = [g.history("acme", "small", f"req-{i}").judge_sample for i in range(64)]

    assert first == [g.history("acme", "small", f"req-{i}").judge_sample for i in range(64)]
    assert any(first) and not all(first)


def test_no_request_is_sampled_with_a_judge_share_of_zero() -> None:
    g, _ = guard(RateRule(min_judged=1, judge_share=0.0))
    record(g, True)

    assert not any(g.history("acme", "small", f"req-{i}").judge_sample for i in range(500))


def serve(g: ThrashGuard, clock: Clock, requests: int, *, small_succeeds: bool) -> list[TierChoice]:
    """`requests` plain `auto` requests, one a second; the cascade judges those started small."""
    choices = []
    for i in range(requests):
        clock.now += 1.0
        choice = start(PLAIN, g.history("acme", "small", f"req-{i}"))
        if choice.tier == "small":
            record(g, not small_succeeds)
        choices.append(choice)
    return choices


def test_the_judged_sample_brings_a_high_rate_down_when_the_small_tier_then_succeeds() -> None:
    # A long half-life, so that it is the judged sample, not the decay, that brings the rate down.
    rule = RateRule(half_life_s=3600.0, min_judged=5, judge_share=0.1)
    g, clock = guard(rule)
    record(g, *[True] * 15)
    assert start(PLAIN, g.history("acme", "small")).tier == "large"

    choices = serve(g, clock, 200, small_succeeds=True)

    assert start(PLAIN, g.history("acme", "small")).tier == "small"
    assert all(c.tier == "small" and c.rule == "classifier" for c in choices[-50:])
    # Without the sample the same tenant is still sent to the large tier, unjudged.
    unsampled, clock = guard(replace(rule, judge_share=0.0))
    record(unsampled, *[True] * 15)
    assert all(c.tier == "large" for c in serve(unsampled, clock, 200, small_succeeds=True))


def test_a_sampled_tenant_whose_small_tier_keeps_failing_keeps_its_high_rate() -> None:
    g, clock = guard(RateRule(half_life_s=3600.0, min_judged=5, judge_share=0.1))
    record(g, *[True] * 15)

    choices = serve(g, clock, 200, small_succeeds=False)

    assert g.history("acme", "small").rate == 1.0
    assert sum(c.tier == "small" for c in choices) < 40  # about the judged share, no more


def test_the_rate_and_the_cool_down_each_keep_their_own_minimum() -> None:
    # Five escalations give the classifier a rate; the cool-down still waits for min_requests.
    g, _ = guard(RateRule(min_judged=5), ThrashRule(min_requests=20, max_rate=0.5))
    record(g, *[True] * 5)

    history = g.history("acme", "small")
    assert history.rate == 1.0 and not history.cooling_down

    record(g, *[True] * 15)

    assert g.history("acme", "small").cooling_down

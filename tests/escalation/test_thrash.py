"""Thrash protection: a sliding escalation rate per (tenant, family) and a cool-down, on a fake clock.

The rate the classifier reads (decayed, with a minimum sample) is specified in test_escalation_rate.py;
here its minimum is low enough that a handful of verdicts give one.
"""

from __future__ import annotations

from gateway.escalation.thrash import RateRule, ThrashGuard, ThrashRule
from router.classifier import NO_HISTORY

RULE = ThrashRule(window_s=60.0, max_rate=0.5, min_requests=4, cool_down_s=30.0)
RATE = RateRule(half_life_s=60.0, min_judged=3, judge_share=0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guard() -> tuple[ThrashGuard, Clock]:
    clock = Clock()
    return ThrashGuard(RULE, clock, rate=RATE), clock


def record(g: ThrashGuard, *outcomes: bool, tenant: str = "acme", family: str = "small") -> None:
    for escalated in outcomes:
        g.record(tenant, family, escalated=escalated)


def test_a_tenant_without_history_has_none() -> None:
    g, _ = guard()

    assert g.history("acme", "small") == NO_HISTORY
    assert g.history("acme", None) == NO_HISTORY


def test_the_rate_is_the_escalated_share_of_the_judged_requests() -> None:
    g, _ = guard()
    record(g, True, False, False)

    history = g.history("acme", "small")
    assert history.rate == 1 / 3 and not history.cooling_down


def test_over_the_rate_with_enough_requests_the_tenant_cools_down() -> None:
    g, clock = guard()
    record(g, True, True, False)
    assert not g.history("acme", "small").cooling_down  # 3 requests: below min_requests

    record(g, True)  # 3 of 4 escalated: 0.75 > 0.5

    assert g.history("acme", "small").cooling_down
    assert g.history("acme", "small").rate == 0.75
    clock.now += 29.9
    assert g.history("acme", "small").cooling_down


def test_the_cool_down_ends_and_the_tenant_is_judged_afresh() -> None:
    g, clock = guard()
    record(g, True, True, True, True)
    clock.now += 30.0

    assert g.history("acme", "small") == NO_HISTORY
    record(g, False, False, False)  # the escalations that caused the cool-down no longer count
    assert g.history("acme", "small").rate == 0.0


def test_exactly_the_max_rate_does_not_trip() -> None:
    g, _ = guard()
    record(g, True, False, True, False)

    assert not g.history("acme", "small").cooling_down


def test_escalations_older_than_the_window_no_longer_count_towards_a_cool_down() -> None:
    g, clock = guard()
    record(g, True, True, True)
    clock.now += 60.0
    record(g, False, False, False, True)  # 1 of 4 in the window; 4 of 7 had the old ones counted

    assert not g.history("acme", "small").cooling_down


def test_tenants_and_families_are_counted_apart() -> None:
    g, _ = guard()
    record(g, True, True, True, True, tenant="acme")

    assert g.history("acme", "small").cooling_down
    assert g.history("globex", "small") == NO_HISTORY
    assert g.history("acme", "other-small") == NO_HISTORY


def test_verdicts_arriving_during_the_cool_down_do_not_extend_it() -> None:
    g, clock = guard()
    record(g, True, True, True, True)
    clock.now += 20.0
    record(g, True, True, True, True)  # requests that started on small before it began
    clock.now += 10.0

    assert not g.history("acme", "small").cooling_down

"""Failover planning and backoff: bounded, jittered, never outside the decision."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import MAX_ATTEMPTS_BOUND, RetryPolicy, RouteRequest, backoff_delays, next_targets, route
from tests.router.builders import ANYWHERE, LARGE, fleet, node


@given(
    attempts=st.integers(-5, 50),
    base=st.floats(0.0, 5.0),
    cap=st.floats(0.0, 30.0),
    seed=st.integers(0, 2**32),
)
def test_backoff_delays_are_bounded_by_cap_and_exponential_envelope(
    attempts: int, base: float, cap: float, seed: int
) -> None:
    delays = backoff_delays(attempts, base, cap, random.Random(seed))

    assert len(delays) == min(max(attempts, 1), MAX_ATTEMPTS_BOUND) - 1
    for i, delay in enumerate(delays):
        assert 0.0 <= delay <= min(cap, base * 2**i)


def test_backoff_is_jittered() -> None:
    rng = random.Random(7)

    runs = {backoff_delays(5, 0.1, 10.0, rng) for _ in range(20)}

    assert len(runs) == 20


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    assert backoff_delays(4, 0.1, 1.0, random.Random(1)) == backoff_delays(4, 0.1, 1.0, random.Random(1))


def test_one_attempt_has_no_delay() -> None:
    assert backoff_delays(1, 0.1, 1.0, random.Random(0)) == ()


@pytest.mark.parametrize("attempts", [0, MAX_ATTEMPTS_BOUND + 1])
def test_retry_policy_refuses_attempts_outside_the_bound(attempts: int) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=attempts)


def test_retry_policy_plans_at_most_max_attempts_targets() -> None:
    decision = route(
        RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet(*(node(f"n{i}") for i in range(5)))
    )

    plan = RetryPolicy(max_attempts=3).plan(decision)

    assert plan == decision.targets[:3]
    assert len(RetryPolicy(max_attempts=3).delays(random.Random(0))) == 2


def test_next_targets_drops_failed_ones_and_keeps_the_order() -> None:
    decision = route(
        RouteRequest(LARGE, home_region="eu-west"),
        ANYWHERE,
        fleet(node("a", kv=0.0), node("b", kv=0.5), node("c", kv=0.9)),
    )

    assert [t.target_id for t in next_targets(decision, ["a"])] == ["b", "c"]
    assert next_targets(decision, ["a", "b", "c"]) == ()


def test_rerouting_with_exclude_matches_next_targets_when_loads_are_unchanged() -> None:
    fleet_ = fleet(node("a", kv=0.0), node("b", kv=0.5), node("c", "us-east"))
    first = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    again = route(RouteRequest(LARGE, home_region="eu-west", exclude=frozenset({"a"})), ANYWHERE, fleet_)

    assert [t.target_id for t in again.targets] == [t.target_id for t in next_targets(first, {"a"})]

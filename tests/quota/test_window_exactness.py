"""The pure algorithm's guarantee: no 60 s span ever holds more than the limit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.quota import reference
from gateway.quota.model import QuotaLimits
from gateway.quota.window import Geometry

GEO = Geometry()


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=500),
    arrivals=st.lists(
        st.tuples(st.integers(min_value=0, max_value=5_000), st.integers(min_value=0, max_value=120)),
        min_size=1,
        max_size=200,
    ),
)
def test_no_sixty_second_span_exceeds_the_token_limit(limit: int, arrivals: list[tuple[int, int]]) -> None:
    state, now, granted = reference.TenantState(), 1_700_000_000_123, []
    for gap, cost in arrivals:
        now += gap
        if reference.admit(state, now, QuotaLimits(tokens_per_minute=limit), cost, "", 0, GEO).admitted:
            granted.append((now, cost))
    for start, _ in granted:
        in_span = sum(cost for t, cost in granted if start <= t < start + GEO.window_ms)
        assert in_span <= limit


@settings(max_examples=100, deadline=None)
@given(
    limit=st.integers(min_value=1, max_value=500),
    arrivals=st.lists(
        st.tuples(st.integers(min_value=0, max_value=5_000), st.integers(min_value=1, max_value=120)),
        min_size=1,
        max_size=150,
    ),
    used_share=st.floats(min_value=0, max_value=1),
)
def test_refunds_keep_actual_usage_under_the_limit(
    limit: int, arrivals: list[tuple[int, int]], used_share: float
) -> None:
    """Refunded tokens are re-admitted, yet what was really used stays within the limit."""
    state, now, used = reference.TenantState(), 1_700_000_000_000, []
    for gap, cost in arrivals:
        now += gap
        outcome = reference.admit(state, now, QuotaLimits(tokens_per_minute=limit), cost, "", 0, GEO)
        if outcome.admitted:
            actual = int(cost * used_share)
            reference.settle(state, now, outcome.slot, outcome.day, actual - cost, "", GEO)
            used.append((now, actual))
    for start, _ in used:
        assert sum(a for t, a in used if start <= t < start + GEO.window_ms) <= limit


def test_sustained_load_gets_exactly_the_limit_per_window() -> None:
    """Not over-strict either: a steady stream gets `limit` per (window + one bucket)."""
    state, now, granted = reference.TenantState(), 1_700_000_000_000, 0
    for _ in range(6_100):  # 610 s, one try every 100 ms
        now += 100
        granted += reference.admit(state, now, QuotaLimits(requests_per_minute=60), 1, "", 0, GEO).admitted
    assert 10 * 60 <= granted <= 11 * 60

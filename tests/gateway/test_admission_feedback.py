"""What the estimates lately missed by corrects the next ones (gateway/admission/feedback.py)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gateway.admission.feedback import MIN_ERRORS, EstimateFeedback


def test_no_correction_without_enough_recent_errors_and_each_pool_its_own() -> None:
    feedback = EstimateFeedback()
    assert feedback.correction_s("m", "interactive", 0.0) == 0.0
    for _ in range(MIN_ERRORS - 1):
        feedback.observe("m", "interactive", 0.5, 0.0)
    assert feedback.correction_s("m", "interactive", 0.0) == 0.0
    feedback.observe("m", "interactive", 0.5, 0.0)
    assert feedback.correction_s("m", "interactive", 0.0) == 0.5
    assert feedback.correction_s("m", "batch", 0.0) == 0.0
    assert feedback.correction_s("other", "interactive", 0.0) == 0.0


def test_the_correction_covers_nine_errors_in_ten_and_fades_with_a_quiet_window() -> None:
    feedback = EstimateFeedback(window_s=30.0, quantile=0.9)
    # Estimates mostly right, one in five 0.4 s short (a loaded pool's tail).
    for i in range(50):
        feedback.observe("m", "interactive", 0.4 if i % 5 == 0 else 0.01, i * 0.1)
    assert feedback.correction_s("m", "interactive", 5.0) == 0.4
    # One in twenty short: the tail is past the quantile, the correction is the body's.
    quiet = EstimateFeedback(quantile=0.9)
    for i in range(60):
        quiet.observe("m", "interactive", 0.4 if i % 20 == 0 else 0.01, i * 0.1)
    assert quiet.correction_s("m", "interactive", 6.0) == 0.01
    # Thirty quiet seconds later the pool is judged by its model alone.
    assert feedback.correction_s("m", "interactive", 40.0) == 0.0
    feedback.observe("m", "interactive", math.nan, 40.0)  # ignored
    assert feedback.correction_s("m", "interactive", 40.0) == 0.0


@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(0, 10)), max_size=80))
def test_the_correction_is_one_of_the_recent_errors_or_none(observations: list[tuple[float, float]]) -> None:
    feedback = EstimateFeedback()
    now = 0.0
    seen: list[tuple[float, float]] = []
    for error, gap in observations:
        now += gap
        feedback.observe("m", "interactive", error, now)
        seen.append((now, error))
        correction = feedback.correction_s("m", "interactive", now)
        recent = [e for at, e in seen[-64:] if at >= now - 30.0]
        assert correction == 0.0 if len(recent) < MIN_ERRORS else correction in recent


def _reference(seen: list[tuple[float, float]], now: float) -> float:
    recent = sorted(e for at, e in seen[-64:] if at >= now - 30.0)
    return 0.0 if len(recent) < MIN_ERRORS else recent[min(len(recent) - 1, math.ceil(0.9 * len(recent)) - 1)]


@given(
    st.lists(
        st.tuples(st.booleans(), st.floats(-5, 5), st.sampled_from([0.0, 0.5, 3.0, 29.9, 30.0, 31.0])),
        max_size=120,
    )
)
def test_the_remembered_correction_is_always_the_one_computed_afresh(
    steps: list[tuple[bool, float, float]],
) -> None:
    """Admission asks for the correction on every request, so it is remembered between errors;
    asked at any time (between errors, as old ones leave the window), it is what a fresh
    computation over the recent errors gives."""
    feedback = EstimateFeedback(window_s=30.0, quantile=0.9)
    now = 0.0
    seen: list[tuple[float, float]] = []
    for observe, error, gap in steps:
        now += gap
        if observe:
            feedback.observe("m", "interactive", error, now)
            seen.append((now, error))
        assert feedback.correction_s("m", "interactive", now) == _reference(seen, now)


def test_short_and_long_estimates_are_corrected_apart() -> None:
    """A cold prompt's estimate missing by half a second must not hold back cached prompts,
    whose one-step estimates miss by milliseconds (router.overload.PoolWait.short)."""
    feedback = EstimateFeedback()
    for i in range(20):
        feedback.observe("m", "interactive", 0.5, i * 0.1)
        feedback.observe("m", "interactive", 0.01, i * 0.1, short=True)
    assert feedback.correction_s("m", "interactive", 2.0) == 0.5
    assert feedback.correction_s("m", "interactive", 2.0, short=True) == 0.01

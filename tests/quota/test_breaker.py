"""The store breaker (the one CircuitBreaker with the quota's settings): skip after a failure,
one probe after the cool-down."""

from __future__ import annotations

from gateway.health import CircuitBreaker, Outcome, Permit
from gateway.quota import store_breaker


class Ticker:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def allow(breaker: CircuitBreaker) -> Permit | None:
    """May this call go to the store? A permit to hand back with its outcome, or None."""
    permit = breaker.try_acquire()
    return permit if isinstance(permit, Permit) else None


def fail(breaker: CircuitBreaker) -> None:
    permit = allow(breaker)
    assert permit is not None
    breaker.record(permit, Outcome.FAILURE)


def test_failure_skips_the_store_until_the_cooldown_ends() -> None:
    tick = Ticker()
    breaker = store_breaker(1.0, clock=tick)
    permit = allow(breaker)
    assert permit
    breaker.record(permit, Outcome.FAILURE)
    tick.now = 0.99
    assert not allow(breaker)
    assert breaker.retry_after_s() == 1.0 - 0.99
    tick.now = 1.0
    assert allow(breaker)


def test_only_one_probe_at_a_time() -> None:
    tick = Ticker()
    breaker = store_breaker(1.0, clock=tick)
    fail(breaker)
    tick.now = 2.0
    probe = allow(breaker)
    assert probe and not allow(breaker)
    breaker.record(probe, Outcome.SUCCESS)
    assert allow(breaker) and allow(breaker)
    assert breaker.retry_after_s() == 0.0


def test_failed_probe_reopens_for_a_new_cooldown() -> None:
    tick = Ticker()
    breaker = store_breaker(1.0, clock=tick)
    fail(breaker)
    tick.now = 1.5
    probe = allow(breaker)
    assert probe
    breaker.record(probe, Outcome.FAILURE)
    tick.now = 2.4
    assert not allow(breaker)
    tick.now = 2.5
    assert allow(breaker)


def test_abandoned_probe_lets_the_next_call_probe() -> None:
    tick = Ticker()
    breaker = store_breaker(1.0, clock=tick)
    fail(breaker)
    tick.now = 1.0
    probe = allow(breaker)
    assert probe
    breaker.record(probe, Outcome.NEUTRAL)
    assert allow(breaker)


def test_a_call_that_answers_after_the_breaker_opened_closes_it() -> None:
    tick = Ticker()
    breaker = store_breaker(1.0, clock=tick)
    slow, failing = allow(breaker), allow(breaker)
    assert slow and failing
    breaker.record(failing, Outcome.FAILURE)
    assert not allow(breaker)
    breaker.record(slow, Outcome.SUCCESS)  # the store answered after all: back to it at once
    assert allow(breaker) and allow(breaker)

"""The store breaker: skip after a failure, one probe after the cool-down."""

from __future__ import annotations

from gateway.quota import StoreBreaker


class Ticker:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_failure_skips_the_store_until_the_cooldown_ends() -> None:
    tick = Ticker()
    breaker = StoreBreaker(1.0, clock=tick)
    assert breaker.allow()
    breaker.failure()
    tick.now = 0.99
    assert not breaker.allow()
    tick.now = 1.0
    assert breaker.allow()


def test_only_one_probe_at_a_time() -> None:
    tick = Ticker()
    breaker = StoreBreaker(1.0, clock=tick)
    breaker.failure()
    tick.now = 2.0
    assert breaker.allow() and not breaker.allow()
    breaker.success()
    assert breaker.allow() and breaker.allow()


def test_failed_probe_reopens_for_a_new_cooldown() -> None:
    tick = Ticker()
    breaker = StoreBreaker(1.0, clock=tick)
    breaker.failure()
    tick.now = 1.5
    assert breaker.allow()
    breaker.failure()
    tick.now = 2.4
    assert not breaker.allow()
    tick.now = 2.5
    assert breaker.allow()


def test_abandoned_probe_lets_the_next_call_probe() -> None:
    tick = Ticker()
    breaker = StoreBreaker(1.0, clock=tick)
    breaker.failure()
    tick.now = 1.0
    assert breaker.allow()
    breaker.abandon()
    assert breaker.allow()

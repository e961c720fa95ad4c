"""Passive ejection: exponential time out, then exactly one trial request."""

from __future__ import annotations

from gateway.health.ejection import Ejections


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_eject_for_doubling_capped_periods() -> None:
    clock = Clock()
    ejections = Ejections(base_s=1.0, max_s=5.0, clock=clock)
    assert [ejections.record_failure("n") for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert not ejections.available("n")
    assert ejections.available("other")


def test_after_the_back_off_a_single_trial_is_admitted() -> None:
    clock = Clock()
    ejections = Ejections(base_s=1.0, max_s=8.0, clock=clock)
    ejections.record_failure("n")
    assert not ejections.try_acquire("n")
    clock.now += 1.0
    assert ejections.available("n")
    assert ejections.try_acquire("n")
    assert not ejections.available("n") and not ejections.try_acquire("n"), "one trial at a time"


def test_a_failed_trial_doubles_the_ejection_and_a_good_one_readmits() -> None:
    clock = Clock()
    ejections = Ejections(base_s=1.0, max_s=8.0, clock=clock)
    ejections.record_failure("n")
    clock.now += 1.0
    assert ejections.try_acquire("n")
    assert ejections.record_failure("n") == 2.0
    clock.now += 2.0
    assert ejections.try_acquire("n")
    ejections.record_success("n")
    assert ejections.available("n") and ejections.try_acquire("n") and ejections.try_acquire("n")
    assert ejections.ejected() == {}


def test_a_trial_without_verdict_frees_the_slot() -> None:
    clock = Clock()
    ejections = Ejections(base_s=1.0, max_s=8.0, clock=clock)
    ejections.record_failure("n")
    clock.now += 1.0
    assert ejections.try_acquire("n")
    ejections.release("n")
    assert ejections.try_acquire("n")

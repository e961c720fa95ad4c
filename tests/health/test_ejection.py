"""Passive ejection, the nodes' breaker policy: exponential time out, then exactly one trial call.

Driven through the gateway's one BreakerBoard, whose default settings are the ejection policy.
"""

from __future__ import annotations

from gateway.health import BreakerBoard, BreakerState, Outcome, Permit, Rejection, ejection


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def board_with(clock: Clock, *, base_s: float, max_s: float) -> BreakerBoard:
    return BreakerBoard(ejection(base_s=base_s, max_s=max_s), clock=clock)


def fail_next_call(board: BreakerBoard, clock: Clock, node: str) -> float:
    """Wait out the node's ejection if any, fail the call it lets through; how long it is out."""
    open_until = board.breaker(node).open_until
    if open_until is not None:
        clock.now = open_until
    permit = board.try_acquire(node)
    assert isinstance(permit, Permit)
    board.record(node, permit, Outcome.FAILURE)
    until = board.breaker(node).open_until
    assert until is not None
    return until - clock.now


def trial_after_ejection(board: BreakerBoard, clock: Clock, node: str) -> Permit:
    """Eject the node once, wait out its time, and take the one trial it then admits."""
    fail_next_call(board, clock, node)
    clock.now += 1.0
    trial = board.try_acquire(node)
    assert isinstance(trial, Permit)
    return trial


def test_failures_eject_for_doubling_capped_periods() -> None:
    clock = Clock()
    board = board_with(clock, base_s=1.0, max_s=5.0)
    assert [fail_next_call(board, clock, "n") for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert not board.available("n")
    assert board.available("other")


def test_after_the_back_off_a_single_trial_is_admitted() -> None:
    clock = Clock()
    board = board_with(clock, base_s=1.0, max_s=8.0)
    fail_next_call(board, clock, "n")
    assert isinstance(board.try_acquire("n"), Rejection)
    clock.now += 1.0
    assert board.available("n")
    assert isinstance(board.try_acquire("n"), Permit)
    assert not board.available("n") and isinstance(board.try_acquire("n"), Rejection), "one trial at a time"


def test_a_failed_trial_doubles_the_ejection_and_a_good_one_readmits() -> None:
    clock = Clock()
    board = board_with(clock, base_s=1.0, max_s=8.0)
    trial = trial_after_ejection(board, clock, "n")
    board.record("n", trial, Outcome.FAILURE)
    assert board.breaker("n").open_until == clock.now + 2.0
    clock.now += 2.0
    trial = board.try_acquire("n")
    assert isinstance(trial, Permit)
    board.record("n", trial, Outcome.SUCCESS)
    assert board.available("n")
    assert isinstance(board.try_acquire("n"), Permit) and isinstance(board.try_acquire("n"), Permit)
    assert board.state("n") is BreakerState.CLOSED and not board.is_open("n")


def test_a_trial_without_verdict_frees_the_slot() -> None:
    clock = Clock()
    board = board_with(clock, base_s=1.0, max_s=8.0)
    trial = trial_after_ejection(board, clock, "n")
    board.record("n", trial, Outcome.NEUTRAL)
    assert isinstance(board.try_acquire("n"), Permit)


def test_readmission_resets_the_doubling() -> None:
    clock = Clock()
    board = board_with(clock, base_s=1.0, max_s=8.0)
    assert [fail_next_call(board, clock, "n") for _ in range(3)] == [1.0, 2.0, 4.0]
    clock.now += 4.0
    trial = board.try_acquire("n")
    assert isinstance(trial, Permit)
    board.record("n", trial, Outcome.SUCCESS)
    assert fail_next_call(board, clock, "n") == 1.0


def test_a_stream_that_breaks_after_its_first_chunk_ejects_the_node() -> None:
    clock = Clock()
    board = board_with(clock, base_s=1.0, max_s=8.0)
    permit = board.try_acquire("n")
    assert isinstance(permit, Permit)
    board.record("n", permit, Outcome.SUCCESS)  # the first chunk arrived
    board.record_break("n")  # then the stream broke
    assert board.breaker("n").open_until == clock.now + 1.0


def test_a_request_started_before_the_ejection_that_succeeds_readmits_the_node() -> None:
    clock = Clock()
    board = board_with(clock, base_s=1.0, max_s=8.0)
    slow = board.try_acquire("n")
    assert isinstance(slow, Permit)
    fail_next_call(board, clock, "n")
    board.record("n", slow, Outcome.SUCCESS)  # the node answered after all
    assert board.available("n") and board.state("n") is BreakerState.CLOSED
    assert fail_next_call(board, clock, "n") == 1.0  # and the doubling starts over

"""The circuit breaker state machine, driven by a fake clock (failure-rate rule, fixed cool-down:
the providers' settings; the ejection settings are in test_ejection.py)."""

from __future__ import annotations

import pytest

from gateway.health import (
    BreakerBoard,
    BreakerConfig,
    BreakerState,
    CircuitBreaker,
    Cooldown,
    Outcome,
    Permit,
    Rejection,
    RollingWindow,
    ejection,
)
from gateway.health.breaker import WindowStats


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


CONFIG = BreakerConfig(
    opens=RollingWindow(failure_rate=0.5, min_calls=4, window_s=10, buckets=10),
    cooldown=Cooldown(5),
    half_open_probes=1,
)
WINDOW_S, COOLDOWN_S = 10, 5


def make(config: BreakerConfig = CONFIG) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(config, clock), clock


def call(breaker: CircuitBreaker, outcome: Outcome, retry_after: float | None = None) -> None:
    permit = breaker.try_acquire()
    assert isinstance(permit, Permit), permit
    breaker.record(permit, outcome, retry_after=retry_after)


def test_stays_closed_below_min_calls_even_if_all_fail() -> None:
    breaker, _ = make()
    for _ in range(3):
        call(breaker, Outcome.FAILURE)
    assert breaker.state is BreakerState.CLOSED


def test_opens_when_failure_rate_reaches_threshold_with_enough_calls() -> None:
    breaker, _ = make()
    call(breaker, Outcome.SUCCESS)
    call(breaker, Outcome.SUCCESS)
    call(breaker, Outcome.FAILURE)
    assert breaker.state is BreakerState.CLOSED
    call(breaker, Outcome.FAILURE)  # 2 of 4 = 50%
    assert breaker.state is BreakerState.OPEN


def test_stays_closed_while_failure_rate_is_below_threshold() -> None:
    breaker, _ = make()
    for _ in range(10):
        call(breaker, Outcome.SUCCESS)
        call(breaker, Outcome.SUCCESS)
        call(breaker, Outcome.FAILURE)
    assert breaker.state is BreakerState.CLOSED


def test_rejects_fast_while_open_and_says_until_when() -> None:
    breaker, clock = make()
    for _ in range(4):
        call(breaker, Outcome.FAILURE)
    result = breaker.try_acquire()
    assert isinstance(result, Rejection)
    assert result.reason == "open"
    assert result.until == pytest.approx(clock.now + COOLDOWN_S)
    assert not breaker.available()


def test_old_failures_roll_out_of_the_window() -> None:
    breaker, clock = make()
    call(breaker, Outcome.FAILURE)
    call(breaker, Outcome.FAILURE)
    call(breaker, Outcome.FAILURE)
    clock.advance(WINDOW_S + 1)
    call(breaker, Outcome.FAILURE)
    assert breaker.window().calls == 1
    assert breaker.state is BreakerState.CLOSED


def test_half_open_after_cooldown_lets_limited_probes_through() -> None:
    breaker, clock = make()
    for _ in range(4):
        call(breaker, Outcome.FAILURE)
    clock.advance(COOLDOWN_S)
    assert breaker.state is BreakerState.HALF_OPEN
    probe = breaker.try_acquire()
    assert isinstance(probe, Permit) and probe.probe
    second = breaker.try_acquire()
    assert isinstance(second, Rejection) and second.reason == "probing"


def test_probe_success_closes() -> None:
    breaker, clock = make()
    for _ in range(4):
        call(breaker, Outcome.FAILURE)
    clock.advance(COOLDOWN_S)
    call(breaker, Outcome.SUCCESS)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.window().calls == 0  # a closed breaker starts from a clean window


def test_probe_failure_reopens_for_another_cooldown() -> None:
    breaker, clock = make()
    for _ in range(4):
        call(breaker, Outcome.FAILURE)
    clock.advance(COOLDOWN_S)
    call(breaker, Outcome.FAILURE)
    assert breaker.state is BreakerState.OPEN
    assert breaker.open_until == pytest.approx(clock.now + COOLDOWN_S)


def test_needs_the_configured_number_of_probe_successes() -> None:
    config = BreakerConfig(
        opens=RollingWindow(min_calls=1), cooldown=Cooldown(1), half_open_probes=2, probe_successes=2
    )
    breaker, clock = make(config)
    call(breaker, Outcome.FAILURE)
    clock.advance(1)
    first, second = breaker.try_acquire(), breaker.try_acquire()
    assert isinstance(first, Permit) and isinstance(second, Permit)
    breaker.record(first, Outcome.SUCCESS)
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.record(second, Outcome.SUCCESS)
    assert breaker.state is BreakerState.CLOSED


def test_neutral_probe_frees_its_slot_without_a_verdict() -> None:
    breaker, clock = make()
    for _ in range(4):
        call(breaker, Outcome.FAILURE)
    clock.advance(COOLDOWN_S)
    call(breaker, Outcome.NEUTRAL)
    assert breaker.state is BreakerState.HALF_OPEN
    assert isinstance(breaker.try_acquire(), Permit)


def test_outcome_of_a_call_started_before_opening_is_ignored() -> None:
    breaker, clock = make()
    early = breaker.try_acquire()
    assert isinstance(early, Permit)
    for _ in range(4):
        call(breaker, Outcome.FAILURE)
    clock.advance(COOLDOWN_S)
    breaker.record(early, Outcome.SUCCESS)  # not a probe: must not close the breaker
    assert breaker.state is BreakerState.HALF_OPEN


def test_rate_limit_does_not_trip_but_skips_target_until_retry_after() -> None:
    breaker, clock = make()
    for _ in range(10):
        call(breaker, Outcome.RATE_LIMITED, retry_after=0)
    assert breaker.state is BreakerState.CLOSED
    call(breaker, Outcome.RATE_LIMITED, retry_after=3)
    result = breaker.try_acquire()
    assert isinstance(result, Rejection) and result.reason == "throttled"
    assert result.until == pytest.approx(clock.now + 3)
    assert not breaker.available()
    assert breaker.window().rate_limited == 11 and breaker.window().failures == 0
    clock.advance(3)
    assert breaker.available()
    assert isinstance(breaker.try_acquire(), Permit)


def test_rate_limit_without_retry_after_uses_the_default() -> None:
    breaker, clock = make(BreakerConfig(default_retry_after_s=2))
    call(breaker, Outcome.RATE_LIMITED)
    clock.advance(1.9)
    assert not breaker.available()
    clock.advance(0.1)
    assert breaker.available()


def test_trip_from_another_replica_opens_until_then() -> None:
    breaker, clock = make()
    breaker.trip(clock.now + 7)
    assert breaker.state is BreakerState.OPEN
    breaker.trip(clock.now + 3)  # an earlier instant never shortens an opening
    assert breaker.open_until == pytest.approx(clock.now + 7)
    clock.advance(7)
    assert breaker.state is BreakerState.HALF_OPEN


def test_trip_in_the_past_is_ignored() -> None:
    breaker, clock = make()
    breaker.trip(clock.now - 1)
    assert breaker.state is BreakerState.CLOSED


def test_invalid_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="failure_rate"):
        RollingWindow(failure_rate=1.5)


def test_a_node_and_a_provider_share_one_state_machine() -> None:
    """One board, one breaker class; only the opening rule and the cool-down differ."""
    clock = FakeClock()
    board = BreakerBoard(ejection(base_s=1, max_s=8), clock=clock)  # every node's settings
    board.register("openai-us", CONFIG)  # a provider's own: 50% of at least 4 calls, 5 s
    node, provider = board.breaker("eu-1"), board.breaker("openai-us")
    assert type(node) is type(provider) is CircuitBreaker

    def fail(target: str) -> None:
        permit = board.try_acquire(target)
        assert isinstance(permit, Permit)
        board.record(target, permit, Outcome.FAILURE)

    fail("eu-1")
    assert board.state("eu-1") is BreakerState.OPEN  # one failure ejects a node
    for _ in range(3):
        fail("openai-us")
    assert board.state("openai-us") is BreakerState.CLOSED  # below min_calls
    fail("openai-us")
    assert board.state("openai-us") is BreakerState.OPEN
    assert not board.available("eu-1") and not board.available("openai-us")

    clock.advance(5)
    for target in ("eu-1", "openai-us"):
        assert board.state(target) is BreakerState.HALF_OPEN
        trial = board.try_acquire(target)
        assert isinstance(trial, Permit) and trial.probe
        assert isinstance(board.try_acquire(target), Rejection)  # one trial each
        board.record(target, trial, Outcome.FAILURE)
    # A failed trial re-opens both: the node for twice its first ejection, the provider for its
    # fixed cool-down.
    assert board.breaker("eu-1").open_until == pytest.approx(clock.now + 2)
    assert board.breaker("openai-us").open_until == pytest.approx(clock.now + 5)

    clock.advance(5)
    for target in ("eu-1", "openai-us"):
        trial = board.try_acquire(target)
        assert isinstance(trial, Permit)
        board.record(target, trial, Outcome.SUCCESS)
        assert board.state(target) is BreakerState.CLOSED and board.available(target)


def test_a_stream_broken_after_its_first_chunk_counts_once_as_a_failure() -> None:
    breaker, _ = make()
    for _ in range(2):
        call(breaker, Outcome.SUCCESS)  # streams whose first chunk arrived ...
        breaker.record_break()  # ... and that broke later
    assert breaker.window() == WindowStats(calls=2, failures=2, rate_limited=0)
    call(breaker, Outcome.SUCCESS)
    assert breaker.state is BreakerState.CLOSED
    call(breaker, Outcome.SUCCESS)
    breaker.record_break()
    assert breaker.state is BreakerState.OPEN  # 3 of 4

"""Bounded tier queues, without a model: the admission rule, the drain meter, the per-tier counts."""

from __future__ import annotations

import pytest

from protocol.first_token import StepCost
from regional_node.engine.admission import (
    QueueLimits,
    QueueState,
    estimated_wait_s,
    first_token_s,
    retry_after_s,
    tokens_ahead,
)
from regional_node.engine.admission import check as check_state
from regional_node.engine.block_manager import BlockManager
from regional_node.engine.drain import DrainMeter, fit_step_cost
from regional_node.engine.errors import QueueFullError
from regional_node.engine.scheduler import Scheduler
from regional_node.engine.sequence import Sequence

STEP_50MS = StepCost(base_s=0.05)
LIMITS = QueueLimits(max_waiting_tokens={"interactive": 400, "batch": 1000}, max_retry_after_s=30)


def check(limits: QueueLimits, waiting: dict[str, int], tier: str, tokens: int, drain: float) -> None:
    """The token-queue rules alone: a queue with a drain rate and nothing else measured."""
    check_state(limits, QueueState(waiting, drain_tokens_per_s=drain), tier, tokens)


def refusal(waiting: dict[str, int], tier: str, tokens: int, drain: float, limits: QueueLimits = LIMITS):
    with pytest.raises(QueueFullError) as caught:
        check(limits, waiting, tier, tokens, drain)
    return caught.value


def test_a_request_that_would_pass_its_tiers_bound_is_refused_and_others_are_not() -> None:
    waiting = {"interactive": 0, "batch": 900}
    check(LIMITS, waiting, "batch", 100, 50.0)  # exactly at the bound: admitted
    error = refusal(waiting, "batch", 101, 50.0)
    assert (error.tier, error.reason) == ("batch", "queue_tokens")
    # Only batch's bound is hit: interactive has its own.
    check(LIMITS, waiting, "interactive", 300, 50.0)


def test_retry_after_is_the_time_to_drain_what_blocks_the_request() -> None:
    # 900 batch tokens wait; 200 more fit once the queue is down to 800: 100 tokens at 50/s.
    assert refusal({"interactive": 0, "batch": 900}, "batch", 200, 50.0).retry_after_s == 2
    # Interactive tokens are served before any batch token, so they come first.
    assert refusal({"interactive": 300, "batch": 900}, "batch", 200, 50.0).retry_after_s == 8
    # But batch tokens never delay an interactive request.
    assert refusal({"interactive": 390, "batch": 900}, "interactive", 20, 5.0).retry_after_s == 2


def test_retry_after_is_at_least_one_second_and_capped() -> None:
    assert refusal({"interactive": 0, "batch": 1000}, "batch", 1, 1e6).retry_after_s == 1
    assert refusal({"interactive": 0, "batch": 1000}, "batch", 500, 1.0).retry_after_s == 30
    # No measured rate yet: the wait is unknown, so the cap.
    assert refusal({"interactive": 0, "batch": 1000}, "batch", 1, 0.0).retry_after_s == 30
    assert retry_after_s(0, 10.0, 30) == 1 and retry_after_s(301, 10.0, 30) == 30


def test_an_empty_queue_takes_a_request_longer_than_the_bound() -> None:
    check(LIMITS, {"interactive": 0, "batch": 0}, "batch", 5000, 50.0)
    # On a non-empty queue it waits for the whole queue to go.
    assert refusal({"interactive": 0, "batch": 10}, "batch", 5000, 5.0).retry_after_s == 2


def test_a_tier_without_a_bound_takes_anything() -> None:
    limits = QueueLimits(max_waiting_tokens={"interactive": 10})
    check(limits, {"interactive": 0, "batch": 10**9}, "batch", 10**6, 1.0)


def test_a_wait_limit_refuses_on_the_estimated_wait_of_the_tokens_ahead() -> None:
    limits = QueueLimits(max_wait_s={"interactive": 2.0}, max_retry_after_s=60)
    # 300 interactive tokens ahead at 100 tokens/s: 3 s > 2 s; 1 s until it is 2 s.
    error = refusal({"interactive": 300, "batch": 0}, "interactive", 1, 100.0, limits)
    assert (error.reason, error.retry_after_s) == ("queue_wait", 1)
    # Batch tokens are not ahead of an interactive request.
    check(limits, {"interactive": 100, "batch": 10**6}, "interactive", 1, 100.0)
    # Without a measured rate the wait is unknown, not long: admitted.
    check(limits, {"interactive": 10**6, "batch": 0}, "interactive", 1, 0.0)


def test_tokens_ahead_and_the_estimated_wait_follow_tier_priority() -> None:
    waiting = {"interactive": 100, "batch": 300}
    assert (tokens_ahead(waiting, "interactive"), tokens_ahead(waiting, "batch")) == (100, 400)
    assert estimated_wait_s(400, 100.0, 60) == 4.0
    assert estimated_wait_s(0, 0.0, 60) == 0.0  # nothing waits: no wait, rate or not
    assert estimated_wait_s(400, 0.0, 60) == 60.0  # a queue and no measured rate: the cap


def test_the_time_to_first_token_is_the_step_in_progress_plus_the_prefill_steps_at_the_recent_step_time() -> (
    None
):
    state = QueueState(
        {"interactive": 0, "batch": 0},
        step_cost=STEP_50MS,
        max_num_batched_tokens=256,
        max_num_seqs=6,
        running=2,
    )
    # Nothing ahead: the step in progress, then one step with its prompt.
    assert first_token_s(state, "interactive", 40, 60) == pytest.approx(0.1)
    # 600 interactive tokens ahead plus its own 40: three prefill steps after the current one.
    ahead = QueueState(
        {"interactive": 600, "batch": 10**6},
        step_cost=STEP_50MS,
        max_num_batched_tokens=256,
        max_num_seqs=6,
        running=2,
    )
    assert first_token_s(ahead, "interactive", 40, 60) == pytest.approx(0.2)
    # The same queue at twice the step time (a bigger batch): twice the wait, with nothing more waiting.
    slower = QueueState(
        {"interactive": 600, "batch": 0},
        step_cost=StepCost(base_s=0.1),
        max_num_batched_tokens=256,
        max_num_seqs=6,
        running=2,
    )
    assert first_token_s(slower, "interactive", 40, 60) == pytest.approx(0.4)
    # Idle (nothing running or waiting): one step of its own prompt, no step in progress.
    idle = QueueState(
        {"interactive": 0, "batch": 0},
        step_cost=StepCost(base_s=0.5),
        max_num_batched_tokens=256,
        max_num_seqs=4,
    )
    assert first_token_s(idle, "interactive", 40, 60) == pytest.approx(0.5)


def test_with_partial_prefills_a_short_prompt_skips_the_long_ones_and_a_long_one_waits_at_their_pace() -> (
    None
):
    cost = StepCost(base_s=0.05, per_token_s=0.001)

    def state(threshold: int, waiting: int) -> QueueState:
        return QueueState(
            {"interactive": waiting, "batch": 0},
            step_cost=cost,
            max_num_batched_tokens=2048,
            max_num_seqs=8,
            running=1,
            long_prefill_token_threshold=threshold,
        )

    # Without the threshold a 20-token prompt waits behind 4,000 queued tokens: two 2,047-token
    # steps after the one in progress.
    assert first_token_s(state(0, 4000), "interactive", 20, 60) == pytest.approx(0.051 * 3 + 4.02)
    # With it, one step after the one in progress, with two long chunks in those steps.
    assert first_token_s(state(256, 4000), "interactive", 20, 60) == pytest.approx(0.051 * 2 + 0.532)
    # ...and the queue's size no longer matters to it.
    assert first_token_s(state(256, 40_000), "interactive", 20, 60) == first_token_s(
        state(256, 4000), "interactive", 20, 60
    )
    # A long prompt waits for the prompts ahead at 256 tokens a step: 4,000 + 1,000 in 20 steps.
    assert first_token_s(state(256, 4000), "interactive", 1000, 60) == pytest.approx(0.051 * 21 + 5.0)


def test_the_waiting_tokens_count_a_prefill_in_progress_until_its_last_chunk() -> None:
    scheduler = Scheduler(
        BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=64, long_prefill_token_threshold=16
    )
    scheduler.add(Sequence("long", list(range(60)), 60, 1))
    assert scheduler.prompt_tokens_by_tier()["interactive"] == 60
    out = scheduler.schedule()
    scheduler.step_done(out)
    assert scheduler.prompt_tokens_by_tier()["interactive"] == 44  # running now, 44 still to compute
    for _ in range(3):
        scheduler.step_done(scheduler.schedule())
    assert scheduler.prompt_tokens_by_tier()["interactive"] == 0


def test_without_a_free_slot_a_request_also_waits_for_running_ones_to_finish() -> None:
    base = {
        "waiting_tokens": {"interactive": 10, "batch": 10},
        "step_cost": STEP_50MS,
        "max_num_batched_tokens": 256,
        "running": 4,
    }
    # One interactive request waits and no slot is free: two must finish, at 4 per second.
    full = QueueState(
        **base, waiting_requests={"interactive": 1, "batch": 1}, max_num_seqs=4, finish_rate=4.0
    )
    assert first_token_s(full, "interactive", 10, 60) == pytest.approx(0.5 + 0.1)
    # A batch request also waits for the waiting batch request's slot.
    assert first_token_s(full, "batch", 10, 60) == pytest.approx(0.75 + 0.1)
    # Two free slots take the waiting interactive request and this one: no slot wait.
    roomy = QueueState(
        **base, waiting_requests={"interactive": 1, "batch": 5}, max_num_seqs=6, finish_rate=4.0
    )
    assert first_token_s(roomy, "interactive", 10, 60) == pytest.approx(0.1)
    # Slots full and nothing finished lately: unknown.
    stuck = QueueState(**base, waiting_requests={}, max_num_seqs=4)
    assert first_token_s(stuck, "interactive", 10, 60) == pytest.approx(60 + 0.1)


def test_a_wait_limit_refuses_on_the_step_time_estimate_even_with_an_empty_queue() -> None:
    limits = QueueLimits(max_wait_s={"interactive": 0.15}, max_retry_after_s=30)
    quick = QueueState(
        {"interactive": 0, "batch": 0},
        step_cost=STEP_50MS,
        max_num_batched_tokens=256,
        max_num_seqs=9,
        running=1,
    )
    check_state(limits, quick, "interactive", 40)  # 0.1 s
    busy = QueueState(
        {"interactive": 0, "batch": 0},
        step_cost=StepCost(base_s=0.1),
        max_num_batched_tokens=256,
        max_num_seqs=9,
        running=1,
    )
    with pytest.raises(QueueFullError) as caught:
        check_state(limits, busy, "interactive", 40)  # 0.2 s: the batch has grown
    assert (caught.value.reason, caught.value.retry_after_s) == ("queue_wait", 1)
    # Full slots with no finish measured are unknown, not long: admitted on the steps alone.
    full = QueueState(
        {"interactive": 0}, step_cost=STEP_50MS, max_num_batched_tokens=256, max_num_seqs=1, running=1
    )
    check_state(limits, full, "interactive", 4)  # 0.1 s
    # Batch has no wait limit here.
    check_state(limits, busy, "batch", 40)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_drain_rate_is_tokens_over_the_recent_window_and_falls_to_zero_when_idle() -> None:
    clock = Clock()
    meter = DrainMeter(window_s=5.0, clock=clock)
    assert meter.rate() == 0.0  # never stepped
    for _ in range(4):  # four 0.5 s steps of 100 tokens, back to back
        meter.record(clock.now, clock.now + 0.5, 100)
        clock.now += 0.5
    assert meter.rate() == pytest.approx(200.0)
    clock.now += 1.0  # idle time inside the window counts: throughput, not step speed
    assert meter.rate() == pytest.approx(400 / 3.0)
    clock.now += 5.0  # every step has left the window: idle reads 0, not the last busy rate
    assert meter.rate() == 0.0


def test_the_step_cost_is_fitted_on_steps_of_every_size_and_outlasts_idle_spells() -> None:
    clock = Clock()
    meter = DrainMeter(window_s=5.0, clock=clock)
    assert not meter.step_cost().measured and (meter.finish_rate(), meter.slot_rate()) == (0.0, 0.0)
    # Prefill steps of 64..512 tokens and decode steps of 1..8, each 10 ms + 0.1 ms a token.
    for tokens in (512, 3, 256, 8, 64, 1, 128, 5):
        duration = 0.010 + 0.0001 * tokens
        meter.record(clock.now, clock.now + duration, tokens, finished=1)
        clock.now += duration
    cost = meter.step_cost()
    assert (cost.base_s, cost.per_token_s) == (pytest.approx(0.010), pytest.approx(0.0001))
    finish_rate = meter.finish_rate()
    assert finish_rate > 0 and meter.slot_rate() == finish_rate
    # A long decode-only spell keeps only a few steps of its size: the prefill sizes stay known.
    for _ in range(1000):
        meter.record(clock.now, clock.now + 0.0104, 4)
        clock.now += 0.0104
    assert meter.step_cost().step_s(512) == pytest.approx(0.0612, rel=0.05)
    # Idle past the window: the throughput and the window's finish rate are gone, but what a step
    # costs and how fast slots freed while busy are not.
    clock.now += 60.0
    assert (meter.rate(), meter.finish_rate()) == (0.0, 0.0)
    assert meter.step_cost().step_s(512) == pytest.approx(0.0612, rel=0.05)
    assert meter.slot_rate() == pytest.approx(finish_rate, rel=0.1)  # as of the last finish


def test_the_step_cost_fit_never_goes_negative_and_needs_a_spread_of_sizes() -> None:
    assert fit_step_cost([(4, 0.02), (5, 0.03), (6, 0.01)]) == StepCost(base_s=pytest.approx(0.02))
    # Bigger steps measured faster (noise): no per-token cost, the median step.
    assert fit_step_cost([(1, 0.05), (500, 0.01)]) == StepCost(base_s=pytest.approx(0.03))
    # A line through the origin where the intercept would be negative.
    fitted = fit_step_cost([(10, 0.001), (100, 0.1)])
    assert fitted.base_s == 0 and fitted.per_token_s > 0


def test_a_stalled_step_does_not_stick_to_the_step_cost() -> None:
    # Steps of every size at 30 ms + 0.1 ms a token, then one 2,048-token step that waited 8 s for
    # a core, and one decode step that waited 20 s. (A least-squares fit, or a mean, took such a
    # stall for the engine's speed for as long as the step was kept: an idle node then reported a
    # 0.77 s first token.)
    clock = Clock()
    meter = DrainMeter(window_s=5.0, clock=clock)
    for _ in range(3):
        for tokens in (1, 2, 4, 8, 16, 64, 256, 1024, 2048):
            meter.record(clock.now, clock.now + 0.030 + 0.0001 * tokens, tokens)
            clock.now += 1.0
    meter.record(clock.now, clock.now + 8.0, 2048)
    meter.record(clock.now, clock.now + 20.0, 3)
    cost = meter.step_cost()
    assert cost.base_s == pytest.approx(0.030, abs=0.005)
    assert cost.per_token_s == pytest.approx(0.0001, rel=0.05)


def test_after_an_idle_spell_the_rate_starts_from_the_first_new_step() -> None:
    clock = Clock()
    meter = DrainMeter(window_s=5.0, clock=clock)
    meter.record(clock.now, clock.now + 0.1, 10)
    clock.now += 60.0
    meter.record(clock.now, clock.now + 0.25, 500)
    clock.now += 0.25
    assert meter.rate() == pytest.approx(2000.0)


def _seq(request_id: str, prompt_len: int, priority: str) -> Sequence:
    return Sequence(
        request_id=request_id,
        token_ids=list(range(prompt_len)),
        num_prompt_tokens=prompt_len,
        max_tokens=8,
        priority=priority,  # type: ignore[arg-type]
    )


def test_the_waiting_queue_counts_tokens_per_tier_through_admission_and_preemption() -> None:
    scheduler = Scheduler(BlockManager(5, 4), max_num_seqs=4, max_num_batched_tokens=64)
    batch, interactive = _seq("b", 8, "batch"), _seq("i", 4, "interactive")
    scheduler.add(batch)
    scheduler.add(interactive)
    assert scheduler.waiting.tokens_by_tier() == {"interactive": 4, "batch": 8}
    assert scheduler.waiting.requests_by_tier() == {"interactive": 1, "batch": 1}
    preempted: list[Sequence] = []
    for _ in range(20):  # both decode until the pool runs out and the batch sequence yields
        out = scheduler.schedule()
        scheduler.step_done(out)
        for chunk in out.chunks:
            if chunk.completes:
                chunk.seq.token_ids.append(7)
        if out.preempted:
            preempted = out.preempted
            break
        assert scheduler.waiting.tokens_by_tier() == {"interactive": 0, "batch": 0}
    assert preempted == [batch]
    # It waits again with its generated tokens, which are recomputed with its prompt.
    assert scheduler.waiting.tokens_by_tier() == {"interactive": 0, "batch": batch.num_tokens}
    assert batch.num_tokens > 8 and scheduler.waiting.num_tokens == batch.num_tokens
    scheduler.finish(batch)
    assert scheduler.waiting.tokens_by_tier() == {"interactive": 0, "batch": 0}

"""The pool's time-to-first-token estimate (router/overload.py) and routing a degraded request."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.first_token import EngineQueue, StepCost, first_token_s
from regional_node.engine.admission import QueueState
from regional_node.engine.admission import first_token_s as node_first_token_s
from router import (
    FleetSnapshot,
    ModelQueue,
    NodeInfo,
    NodeLoad,
    PendingRequest,
    RouteRequest,
    pool_wait,
    route,
)
from tests.router.builders import JURISDICTION_OF, LARGE, SMALL, fleet, tenant

# A CPU engine: 10 ms a step plus 0.1 ms a batched token; 8 slots, 256 tokens a step.
COST = StepCost(base_s=0.010, per_token_s=0.0001)


def queued(
    node_id: str,
    region: str = "eu-west",
    *,
    model: str = LARGE,
    waiting: int = 0,
    by_tier: dict[str, int] | None = None,
    requests: dict[str, int] | None = None,
    bound: dict[str, int] | None = None,
    running: int = 0,
    max_num_seqs: int | None = 8,
    budget: int = 256,
    cost: StepCost = COST,
    finish_rate: float = 0.0,
    first_token: dict[str, float] | None = None,
    asked_at: float = 0.0,
    healthy: bool = True,
    threshold: int = 0,
) -> NodeInfo:
    queue = ModelQueue(
        waiting_tokens=waiting,
        waiting_tokens_by_tier=by_tier or {},
        queue_bound_tokens=bound or {},
        first_token_s_by_tier=first_token or {},
        waiting_requests_by_tier=requests or {},
        num_running=running,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        step_cost=cost,
        finish_rate=finish_rate,
        long_prefill_token_threshold=threshold,
    )
    return NodeInfo(
        node_id=node_id,
        url=f"http://{node_id}.internal:9000",
        region=region,
        jurisdiction=JURISDICTION_OF[region],
        models=frozenset({model}),
        healthy=healthy,
        load=NodeLoad(waiting_tokens=waiting, num_running=running, models={model: queue}, asked_at=asked_at),
    )


def burst(n: int, tokens: int = 30, tier: str = "interactive", at: float = 1.0) -> list[PendingRequest]:
    return [PendingRequest(tokens, tier, at) for _ in range(n)]  # type: ignore[arg-type]


def estimate(
    snapshot: FleetSnapshot,
    tier: str = "interactive",
    *,
    tokens: int = 30,
    pending: list[PendingRequest] | None = None,
    **policy: object,
):
    return pool_wait(
        snapshot,
        model=LARGE,
        residency=tenant(**policy).residency,  # type: ignore[arg-type]
        tier=tier,  # type: ignore[arg-type]
        prompt_tokens=tokens,
        pending=pending or [],
    )


def wait(snapshot: FleetSnapshot, tier: str = "interactive", **kwargs: object) -> float | None:
    found = estimate(snapshot, tier, **kwargs)  # type: ignore[arg-type]
    return None if found is None else found.wait_s


def test_an_idle_node_starts_a_request_with_one_step_of_its_prompt() -> None:
    found = estimate(fleet(queued("a")), tokens=30)
    assert found is not None and found.idle
    assert found.wait_s == pytest.approx(COST.step_s(30))


def test_a_burst_up_to_the_free_slots_is_one_batched_prefill_step_not_a_token_at_a_time() -> None:
    # Seven short prompts admitted since the idle node's report, and this one: the node may be in
    # a step with the first, then batches the rest (240 tokens) into one step. (The old estimate
    # divided the pending tokens by a 1,000 tok/s fallback rate: 0.24 s, shedding most of such a
    # burst at make up's 50 ms target.)
    found = estimate(fleet(queued("a")), pending=burst(7))
    assert found is not None and not found.idle
    assert found.wait_s == pytest.approx(COST.step_s(0) + COST.step_s(8 * 30))


def test_prompts_beyond_one_step_take_more_steps_beside_the_running_decodes() -> None:
    # 4 running sequences take 4 of the 256 tokens of every step; 600 waiting + 30 own prompt
    # tokens take three steps of 252, after the step in progress.
    node = queued("a", by_tier={"interactive": 600}, requests={"interactive": 3}, running=4)
    expected = COST.step_s(4) + 3 * COST.step_s(4) + COST.per_token_s * 630
    assert wait(fleet(node)) == pytest.approx(expected)


def test_without_a_free_slot_a_request_waits_for_running_ones_to_finish() -> None:
    node = queued("a", running=8, finish_rate=4.0)
    # One must finish (at 4 a second), then the step in progress and its own prefill step.
    assert wait(fleet(node)) == pytest.approx(0.25 + 2 * COST.step_s(8) + COST.per_token_s * 30)
    # No finish rate measured yet: unknown, not long (the node's own bounds judge).
    assert wait(fleet(queued("b", running=8))) == pytest.approx(2 * COST.step_s(8) + COST.per_token_s * 30)


def test_interactive_waits_only_behind_interactive_work_batch_behind_all() -> None:
    node = queued(
        "a",
        waiting=1000,
        by_tier={"interactive": 100, "batch": 900},
        requests={"interactive": 1, "batch": 9},
        max_num_seqs=None,
    )
    interactive, batch = wait(fleet(node), "interactive"), wait(fleet(node), "batch")
    assert interactive == pytest.approx(COST.step_s(0) + COST.step_s(0) + COST.per_token_s * 130)
    assert batch == pytest.approx(COST.step_s(0) + 5 * COST.step_s(0) + COST.per_token_s * 1030)
    # Pending batch requests are not ahead of an interactive one either.
    assert wait(fleet(node), "interactive", pending=burst(5, 200, "batch")) == interactive


def test_a_queue_at_its_bound_is_an_infinite_wait() -> None:
    node = queued("a", waiting=800, by_tier={"interactive": 800}, bound={"interactive": 800})
    assert wait(fleet(node)) == math.inf
    assert wait(fleet(node), "batch") < 1.0


def test_pending_requests_admitted_before_the_report_was_asked_for_are_in_it_already() -> None:
    node = queued("a", by_tier={"interactive": 240}, requests={"interactive": 8}, asked_at=5.0)
    reported = wait(fleet(node))
    assert wait(fleet(node), pending=burst(8, at=4.0)) == reported
    assert wait(fleet(node), pending=burst(8, at=6.0)) > reported


def test_pending_requests_go_where_they_start_soonest_then_the_new_one_does() -> None:
    # Two idle nodes: of two pending requests each takes one, so the third starts beside one.
    two = fleet(queued("a"), queued("b"))
    assert wait(two, pending=burst(2)) == pytest.approx(COST.step_s(0) + COST.step_s(60))
    # One node with its 8 slots busy (one frees a second), one free: the free one takes them all.
    assert wait(
        fleet(queued("full", running=8, finish_rate=1.0), queued("free")), pending=burst(3)
    ) == pytest.approx(COST.step_s(0) + COST.step_s(120))


def test_a_node_that_reports_no_step_cost_is_estimated_by_its_own_report() -> None:
    node = queued("a", cost=StepCost(), first_token={"interactive": 0.4, "batch": 0.9})
    assert wait(fleet(node), "interactive") == 0.4
    assert wait(fleet(node), "batch") == 0.9


def test_the_pool_is_only_nodes_inside_the_residency() -> None:
    busy = queued("eu", "eu-west", by_tier={"interactive": 9000}, requests={"interactive": 5})
    snapshot = fleet(busy, queued("us", "us-east"))

    assert wait(snapshot) == pytest.approx(COST.step_s(30))
    assert wait(snapshot, jurisdictions=("eu",)) > 1.0
    assert wait(fleet(queued("us", "us-east")), jurisdictions=("eu",)) is None


def test_unhealthy_nodes_and_nodes_of_other_models_are_not_in_the_pool() -> None:
    waiting = {"interactive": 2000}
    snapshot = fleet(
        queued("down", healthy=False), queued("small", model=SMALL), queued("up", by_tier=waiting)
    )
    assert wait(snapshot) == wait(fleet(queued("up", by_tier=waiting)))


def test_a_node_without_a_report_for_the_model_counts_as_idle() -> None:
    found = estimate(fleet(NodeInfo("a", "http://a", "eu-west", "eu", frozenset({LARGE}))))
    assert found is not None and found.idle and found.wait_s == 0.0


queues = st.builds(
    EngineQueue,
    waiting_requests=st.integers(0, 64),
    waiting_tokens=st.integers(0, 20_000),
    running=st.integers(0, 64),
    max_num_seqs=st.one_of(st.none(), st.integers(1, 64)),
    max_num_batched_tokens=st.integers(0, 4096),
    step_cost=st.builds(StepCost, base_s=st.floats(0, 0.5), per_token_s=st.floats(0, 0.01)),
    finish_rate=st.one_of(st.just(0.0), st.floats(0.01, 100)),
    long_prefill_token_threshold=st.sampled_from([0, 1, 16, 256]),
)


@settings(max_examples=300, deadline=None)
@given(queue=queues, prompt=st.integers(0, 8000), extra=st.integers(1, 4000))
def test_more_work_ahead_never_shortens_the_estimate(queue: EngineQueue, prompt: int, extra: int) -> None:
    base = first_token_s(queue, prompt, unknown_s=0.0)
    assert base >= 0 and math.isfinite(base)
    more_tokens = EngineQueue(**{**queue.__dict__, "waiting_tokens": queue.waiting_tokens + extra})
    more_requests = EngineQueue(**{**queue.__dict__, "waiting_requests": queue.waiting_requests + 1})
    assert first_token_s(more_tokens, prompt, unknown_s=0.0) >= base - 1e-12
    assert first_token_s(more_requests, prompt, unknown_s=0.0) >= base - 1e-12
    assert first_token_s(queue, prompt + extra, unknown_s=0.0) >= base - 1e-12
    # A prompt whose cached prefix is still being computed waits at least as long as one that
    # is ready (partial prefills start the ready one beside the queue).
    assert first_token_s(queue, prompt, unknown_s=0.0, behind_queue=True) >= base - 1e-12


@settings(max_examples=200, deadline=None)
@given(
    interactive=st.tuples(st.integers(0, 20), st.integers(0, 5000)),
    batch=st.tuples(st.integers(0, 20), st.integers(0, 5000)),
    running=st.integers(0, 16),
    finish_rate=st.floats(0.1, 50),
    prompt=st.integers(1, 2000),
    tier=st.sampled_from(["interactive", "batch"]),
    threshold=st.sampled_from([0, 64]),
)
def test_the_gateway_estimates_a_node_exactly_as_the_node_estimates_itself(
    interactive: tuple[int, int],
    batch: tuple[int, int],
    running: int,
    finish_rate: float,
    prompt: int,
    tier: str,
    threshold: int,
) -> None:
    # One mechanism: with nothing pending, the gateway's estimate from a node's /load report is the
    # node's own admission estimate for the same queue.
    (ir, it), (br, bt) = interactive, batch
    state = QueueState(
        {"interactive": it, "batch": bt},
        waiting_requests={"interactive": ir, "batch": br},
        step_cost=COST,
        max_num_batched_tokens=256,
        max_num_seqs=16,
        finish_rate=finish_rate,
        running=running,
        long_prefill_token_threshold=threshold,
    )
    node = queued(
        "a",
        waiting=it + bt,
        by_tier={"interactive": it, "batch": bt},
        requests={"interactive": ir, "batch": br},
        running=running,
        max_num_seqs=16,
        finish_rate=finish_rate,
        threshold=threshold,
    )
    assert wait(fleet(node), tier, tokens=prompt) == pytest.approx(
        node_first_token_s(state, tier, prompt, unknown_s=0.0)
    )


def test_a_degraded_request_is_routed_to_the_small_tier_marked_degraded() -> None:
    snapshot = fleet(
        queued("large-eu", waiting=9000),
        queued("small-eu", model=SMALL),
        queued("small-us", "us-east", model=SMALL),
    )
    request = RouteRequest(SMALL, home_region="eu-west", degraded_from=LARGE)

    decision = route(request, tenant(jurisdictions=("eu",), allow_degrade=True), snapshot)

    assert [(t.target_id, t.model) for t in decision.targets] == [("small-eu", SMALL)]
    assert decision.targets[0].reason.startswith("degraded;")
    assert f"degraded from {LARGE}" in decision.reason


def test_decoding_sequences_do_not_hold_back_a_request_with_nothing_queued_ahead() -> None:
    """Admission always lets in a request that starts with the next step (`idle`): sequences
    decoding there only lengthen the steps. A prompt queued ahead, or no free slot, does not."""
    assert estimate(fleet(queued("a", running=6)), tokens=2000).idle
    assert not estimate(fleet(queued("a", running=8)), tokens=2000).idle  # every slot taken
    assert not estimate(fleet(queued("a", running=2, waiting=300, requests={"interactive": 1}))).idle


def test_a_cached_prompt_is_estimated_short_unless_its_prefix_is_still_being_computed() -> None:
    node = queued(
        "a", waiting=4000, by_tier={"interactive": 4000}, requests={"interactive": 2}, running=1, threshold=64
    )
    common = {"model": LARGE, "residency": tenant().residency, "tier": "interactive", "prompt_tokens": 2000}
    ready = pool_wait(fleet(node), cached={"a": 1990}, **common)  # type: ignore[arg-type]
    computing = pool_wait(fleet(node), cached={"a": 1990}, not_ready=frozenset({"a"}), **common)  # type: ignore[arg-type]
    cold = pool_wait(fleet(node), **common)  # type: ignore[arg-type]
    assert ready is not None and computing is not None and cold is not None
    assert ready.short and ready.tokens == 10 and ready.wait_s < 0.1
    assert not computing.short and computing.wait_s > 10 * ready.wait_s  # behind the 4,000 tokens
    assert cold.wait_s > computing.wait_s

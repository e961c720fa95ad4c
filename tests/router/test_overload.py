"""The pool's queueing-delay estimate (router/overload.py) and routing a degraded request."""

from __future__ import annotations

import math

from router import FleetSnapshot, ModelQueue, NodeInfo, NodeLoad, RouteRequest, pool_wait, route
from tests.router.builders import JURISDICTION_OF, LARGE, SMALL, fleet, tenant

FALLBACK = 1000.0


def queued(
    node_id: str,
    region: str = "eu-west",
    *,
    model: str = LARGE,
    waiting: int = 0,
    by_tier: dict[str, int] | None = None,
    bound: dict[str, int] | None = None,
    drain: float = 0.0,
    first_token: dict[str, float] | None = None,
    healthy: bool = True,
) -> NodeInfo:
    queue = ModelQueue(
        waiting_tokens=waiting,
        waiting_tokens_by_tier=by_tier or {},
        queue_bound_tokens=bound or {},
        drain_tokens_per_s=drain,
        first_token_s_by_tier=first_token or {},
    )
    return NodeInfo(
        node_id=node_id,
        url=f"http://{node_id}.internal:9000",
        region=region,
        jurisdiction=JURISDICTION_OF[region],
        models=frozenset({model}),
        healthy=healthy,
        load=NodeLoad(waiting_tokens=waiting, models={model: queue}),
    )


def wait(
    snapshot: FleetSnapshot, tier: str = "interactive", *, pending: int = 0, **policy: object
) -> float | None:
    estimate = pool_wait(
        snapshot,
        model=LARGE,
        residency=tenant(**policy).residency,  # type: ignore[arg-type]
        tier=tier,  # type: ignore[arg-type]
        fallback_drain_tokens_per_s=FALLBACK,
        pending_tokens=pending,
    )
    return None if estimate is None else estimate.wait_s


def test_wait_is_queued_tokens_over_the_measured_drain_rate() -> None:
    assert wait(fleet(queued("a", waiting=3000, drain=1500.0))) == 2.0


def test_a_nodes_own_time_to_first_token_estimate_wins_over_its_queue() -> None:
    # Nothing waits, but the node's steps have slowed (a CPU node filling up): its estimate counts.
    busy = queued("a", drain=1500.0, first_token={"interactive": 0.4, "batch": 0.9})
    assert wait(fleet(busy), "interactive") == 0.4
    assert wait(fleet(busy), "batch") == 0.9
    # The best node of the pool, as ever; a tier the node does not estimate falls back to its queue.
    assert wait(fleet(busy, queued("b", waiting=300, drain=1500.0))) == 0.2
    assert wait(fleet(queued("c", waiting=3000, drain=1500.0, first_token={"batch": 5.0}))) == 2.0
    # A queue at its bound still refuses whatever the node estimates.
    full = queued(
        "d", by_tier={"interactive": 800}, bound={"interactive": 800}, first_token={"interactive": 0.1}
    )
    assert wait(fleet(full)) == math.inf


def test_an_unmeasured_drain_rate_uses_the_fallback() -> None:
    assert wait(fleet(queued("a", waiting=3000))) == 3.0


def test_the_best_node_of_the_pool_decides() -> None:
    assert wait(fleet(queued("busy", waiting=9000), queued("calm", waiting=500))) == 0.5


def test_interactive_waits_only_behind_interactive_tokens_batch_behind_all() -> None:
    snapshot = fleet(queued("a", waiting=5000, by_tier={"interactive": 1000, "batch": 4000}))

    assert wait(snapshot, "interactive") == 1.0
    assert wait(snapshot, "batch") == 5.0


def test_a_queue_at_its_bound_is_an_infinite_wait() -> None:
    snapshot = fleet(queued("a", waiting=800, by_tier={"interactive": 800}, bound={"interactive": 800}))

    assert wait(snapshot) == math.inf
    assert wait(snapshot, "batch") == 0.8


def test_pending_tokens_raise_the_estimate_over_the_pools_drain_rate() -> None:
    snapshot = fleet(queued("a", drain=500.0), queued("b", drain=1500.0))

    assert wait(snapshot, pending=4000) == 2.0
    # The nodes' own reports may already hold the pending tokens: the larger view wins, not the sum.
    assert wait(fleet(queued("a", waiting=6000, drain=2000.0)), pending=4000) == 3.0


def test_the_pool_is_only_nodes_inside_the_residency() -> None:
    snapshot = fleet(queued("eu", "eu-west", waiting=9000), queued("us", "us-east"))

    assert wait(snapshot) == 0.0
    assert wait(snapshot, jurisdictions=("eu",)) == 9.0
    assert wait(fleet(queued("us", "us-east")), jurisdictions=("eu",)) is None


def test_unhealthy_nodes_and_nodes_of_other_models_are_not_in_the_pool() -> None:
    snapshot = fleet(queued("down", healthy=False), queued("small", model=SMALL), queued("up", waiting=2000))

    assert wait(snapshot) == 2.0


def test_a_node_without_a_report_for_the_model_counts_as_idle() -> None:
    assert wait(fleet(NodeInfo("a", "http://a", "eu-west", "eu", frozenset({LARGE})))) == 0.0


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

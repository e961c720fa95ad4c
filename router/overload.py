"""Time to first token: how long a new request would wait for its first token in a model's pool.

One node, one model, a new request of traffic tier T. The node reports its own estimate for T
(`first_token_s_by_tier`: a free slot, then the prefill steps ahead of the request at the node's
recent step time, which grows with the batch — regional_node/engine/admission.py, the estimate the
node itself admits by). A node that does not report one (older than the field) is estimated from
its queue, with the tokens ahead of the request:

- interactive: the node's waiting interactive tokens (the node schedules interactive work before
  batch work), or every waiting token of the model when the node does not report tiers;
- batch: every waiting token of the model (it queues behind both tiers).

    node wait = tokens ahead / drain rate

where the drain rate is the node's measured `drain_tokens_per_s`, or `fallback_drain_tokens_per_s`
while it has none (a node that has not served yet). A node whose queue for T is at its
`queue_bound_tokens` would refuse the request: its wait is infinite.

The pool is the nodes routing may use for the request: serving the model, healthy, inside the
tenant's residency (`router.candidates`, the same screen `route` uses, so an estimate never looks
at a node the request could not go to). Routing sends a request to the least loaded of them, so

    pool wait = max(min over the pool's nodes of node wait, pending_tokens / Σ their drain rates)

`pending_tokens` are the tokens ahead of T that the caller (the gateway) has admitted to this pool
and that have not had their first token yet: a node reports them only at the next probe, and
without this term a spike could pour a whole probe interval's arrivals into one queue. It is the
max, not the sum, because the nodes' last reports may already hold some of those tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.candidates import screen_nodes
from router.types import FleetSnapshot, NodeLoad, Residency, TrafficTier


@dataclass(frozen=True)
class PoolWait:
    """The estimated wait before a new request's first step, and what it rests on."""

    wait_s: float  # may be math.inf: every node's queue for the tier is at its bound
    nodes: int  # the pool's nodes (at least one)
    drain_tokens_per_s: float  # summed over the pool's nodes


def node_wait_s(
    load: NodeLoad | None, *, model: str, tier: TrafficTier, fallback_drain_tokens_per_s: float
) -> tuple[float, float]:
    """(wait in seconds, drain rate used) for a new `tier` request of `model` on one node."""
    queue = load.models.get(model) if load is not None else None
    if queue is None:
        # No report for the model (not probed yet, or a node older than per-model reports).
        return 0.0, fallback_drain_tokens_per_s
    rate = queue.drain_tokens_per_s
    if not rate > 0:  # also NaN
        rate = fallback_drain_tokens_per_s
    by_tier = queue.waiting_tokens_by_tier
    if tier == "interactive" and by_tier:
        ahead = by_tier.get("interactive", 0)
    else:
        ahead = max(queue.waiting_tokens, sum(by_tier.values()))
    bound = queue.queue_bound_tokens.get(tier)
    queued_for_tier = by_tier.get(tier, queue.waiting_tokens) if by_tier else queue.waiting_tokens
    if bound is not None and queued_for_tier >= bound:
        return math.inf, rate
    reported = queue.first_token_s_by_tier.get(tier)
    if reported is not None:
        return reported, rate
    return max(ahead, 0) / rate, rate


def pool_wait(
    fleet: FleetSnapshot,
    *,
    model: str,
    residency: Residency,
    tier: TrafficTier,
    fallback_drain_tokens_per_s: float,
    pending_tokens: int = 0,
) -> PoolWait | None:
    """The pool's estimated wait (module docstring); None when no node may serve the request, in
    which case routing, not admission, has the answer (a 503 that says why)."""
    assert fallback_drain_tokens_per_s > 0, "the fallback drain rate must be positive"
    nodes = screen_nodes(fleet.nodes, model=model, residency=residency, exclude=frozenset()).admitted
    if not nodes:
        return None
    waits = [
        node_wait_s(n.load, model=model, tier=tier, fallback_drain_tokens_per_s=fallback_drain_tokens_per_s)
        for n in nodes
    ]
    drain = sum(rate for _, rate in waits)
    best = min(wait for wait, _ in waits)
    return PoolWait(
        wait_s=max(best, max(pending_tokens, 0) / drain), nodes=len(nodes), drain_tokens_per_s=drain
    )

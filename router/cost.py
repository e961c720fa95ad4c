"""A node's cost for one request: its estimated time to the request's first token there.

    cost = queue wait + the prompt tokens the node does not hold cached, prefilled at its rate

- queue wait: the first-token estimate admission uses (router/overload.py over
  protocol/first_token.py: a free slot, the prompts queued ahead, the step in progress);
- cached tokens: the longest message prefix of the request (protocol/prefix_cache.py names)
  that the node's published table holds;
- prefill: the uncached tokens through the same estimate, at the node's fitted step cost
  (`per_token_s` is its measured prefill rate). A node that has not measured its step cost
  prefills at the median rate of the nodes that have, else at `RoutingParams.prefill_s_per_token`.

So a cached prefix wins exactly while the prefill it saves is worth more than the extra queue
it waits behind: a hot prefix's node, once its queue costs more than a cold prefill elsewhere,
sends the overflow to a second node, whose table then holds the prefix too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.prefix_cache import cached_tokens, prefix_names
from router.overload import node_first_token_s
from router.params import RoutingParams
from router.types import ModelQueue, NodeInfo, TrafficTier


@dataclass(frozen=True)
class Demand:
    """What one request asks of a node, as its cost needs it."""

    tier: TrafficTier = "interactive"
    prompt_tokens: int = 1
    conversation: tuple[tuple[str, str], ...] = ()
    salt: str | None = None  # the node's cache salt for this tenant (isolated tenants)

    def names(self, model: str) -> tuple[str, ...]:
        return prefix_names(model, self.salt, self.conversation) if self.conversation else ()


@dataclass(frozen=True)
class NodeCost:
    cached_tokens: int
    wait_s: float  # math.inf: the node's queue for the tier is at its bound
    prefill_s: float

    @property
    def total_s(self) -> float:
        return self.wait_s + self.prefill_s

    def describe(self) -> str:
        """The cost parts for the route header: `cost=0.142;cached=768;wait=0.020`."""
        return f"cost={self.total_s:.3f};cached={self.cached_tokens};wait={self.wait_s:.3f}"


def fallback_prefill_s(nodes: Sequence[NodeInfo], model: str, params: RoutingParams) -> float:
    """Seconds per prompt token for a node that has not measured its own: the median of those
    that have (nodes of one model run alike), else the parameter."""
    rates = [
        q.step_cost.per_token_s
        for n in nodes
        if n.load is not None
        and (q := n.load.models.get(model)) is not None
        and q.step_cost.per_token_s > 0
    ]
    return statistics.median(rates) if rates else params.prefill_s_per_token


def node_cost(
    node: NodeInfo,
    *,
    model: str,
    tier: TrafficTier,
    prompt_tokens: int,
    names: Sequence[str],
    fallback_s_per_token: float,
) -> NodeCost:
    load = node.load
    cached = cached_tokens(load.cached_prefixes, names) if load is not None and names else 0
    # The node's block rounding can make a cached prefix cover more than the gateway's estimate.
    uncached = max(prompt_tokens - cached, 1)
    queue = load.models.get(model) if load is not None else None
    wait = _wait_s(queue, tier)
    if math.isinf(wait):
        return NodeCost(cached, math.inf, 0.0)
    if queue is not None and queue.step_cost.measured:
        prefill = max(node_first_token_s(queue, tier, uncached) - wait, 0.0)
    else:
        prefill = uncached * fallback_s_per_token
    return NodeCost(cached, wait, prefill)


def _wait_s(queue: ModelQueue | None, tier: TrafficTier) -> float:
    """The queue part of the estimate (the estimate for a one-token prompt), once per report."""
    if queue is None:
        return node_first_token_s(None, tier, 1)
    key = ("wait", tier)
    wait = queue.derived.get(key)
    if wait is None:
        wait = queue.derived[key] = node_first_token_s(queue, tier, 1)
    return wait


def cost_band(cost: NodeCost, params: RoutingParams) -> float:
    """Costs in one band are equal. Bands grow geometrically by `cost_ratio` from
    `cost_quantum_s` (every cost below it is band 0): each node fits its own step cost on its
    own recent steps, and identical nodes' fits differ by tens of percent on a busy machine, so a
    fixed width would send every new prompt to whichever node's fit is luckiest."""
    total = cost.total_s
    if math.isinf(total):
        return math.inf
    if total <= params.cost_quantum_s:
        return 0
    return 1 + math.floor(math.log(total / params.cost_quantum_s) / math.log(params.cost_ratio))

"""Time to first token: how long a new request would wait for its first token in a model's pool.

Each node reports, per model, what protocol/first_token.py's estimate needs: the requests and
prompt tokens waiting per tier, the sequences running, the engine's batch limits
(`max_num_seqs`, `max_num_batched_tokens`), its fitted step cost and how fast it frees slots. This
module runs that estimate the way the node will run the request:

- ahead of a new interactive request: the node's waiting interactive work (nodes schedule it
  first); ahead of a batch request: everything waiting;
- plus the requests the gateway admitted to this pool after the node's report was asked for
  (`pending`, until their first token): the node cannot have counted them yet, and without them a
  burst would pour a whole probe interval's arrivals into one queue. Routing sends each to the
  node where it starts soonest, so they are placed that way here too, one by one in admission
  order, then the new request goes where it would start soonest;
- a node whose queue for the tier is at its `queue_bound_tokens` would refuse the request: its
  estimate is infinite.

A node that reports no step cost (not stepped yet, or older than the field) is estimated from its
own reported `first_token_s_by_tier` plus the slots its pending requests take; a node with no
report for the model counts as idle.

The pool is the nodes routing may use for the request: serving the model, healthy, inside the
tenant's residency (`router.candidates`, the same screen `route` uses, so an estimate never looks
at a node the request could not go to).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from protocol.first_token import EngineQueue, first_token_s
from router.candidates import screen_nodes
from router.types import FleetSnapshot, ModelQueue, Residency, TrafficTier


@dataclass(frozen=True)
class PendingRequest:
    """A request the gateway admitted to a pool that has not had its first token yet."""

    tokens: int  # its prompt's estimated tokens
    tier: TrafficTier
    admitted_at: float  # the gateway's time.monotonic(), comparable with NodeLoad.asked_at


@dataclass(frozen=True)
class PoolWait:
    """The estimated time to a new request's first token in its pool, and what it rests on."""

    wait_s: float  # may be math.inf: every node's queue for the tier is at its bound
    nodes: int  # the pool's nodes (at least one)
    # Nothing is ahead of the request on the node it would go to (no prompt waiting or pending
    # there, and a free sequence slot): it starts with that node's next step, so no pool could
    # start it sooner and no target should refuse it. Sequences decoding there do not hold it
    # back (they only lengthen each step), so they do not count.
    idle: bool = False
    # The request's tokens to prefill on that node (its prompt less what the node holds).
    tokens: int = 1
    # Those tokens are few enough for that node to start them beside the prompts queued there
    # (partial prefills): such an estimate is one step, and misses differently from a long one.
    short: bool = False


@dataclass(frozen=True)
class _Node:
    """One node's queue ahead of the new request, and the estimate it gives."""

    queue: EngineQueue | None  # None: the estimate is `reported_s` plus the slot wait alone
    reported_s: float
    bounded: bool  # the tier's queue is at its bound

    def estimate(
        self,
        prompt_tokens: int,
        more_requests: int = 0,
        more_tokens: int = 0,
        *,
        behind: bool = False,
        more_running: int = 0,
    ) -> float:
        """`more_requests` of `more_tokens` in all: pending requests placed on this node;
        `more_running`: sequences generating there that its report does not count. `behind`:
        the prompt waits for the prompts queued ahead even if short (its prefix is in one of them)."""
        if self.bounded:
            return math.inf
        if self.queue is None:
            # Pending requests on a node with no report add no wait that anything measured:
            # without a step cost, only a slot limit could (and none is known).
            return self.reported_s
        wait_s = first_token_s(
            self.queue,
            prompt_tokens,
            unknown_s=0.0,
            more_requests=more_requests,
            more_tokens=more_tokens,
            more_running=more_running,
            behind_queue=behind,
        )
        return wait_s if self.queue.step_cost.measured else self.reported_s + wait_s

    @property
    def idle(self) -> bool:
        """No prompt queued ahead and a free slot: a request starts with the next step."""
        q = self.queue
        if q is None:
            return True
        free_slot = q.max_num_seqs is None or q.running < q.max_num_seqs
        return free_slot and q.waiting_requests == 0 and q.waiting_tokens == 0

    def short(self, prompt_tokens: int) -> bool:
        q = self.queue
        return q is not None and 0 < prompt_tokens <= q.long_prefill_token_threshold


def _ahead(queue: ModelQueue | None, tier: TrafficTier) -> _Node:
    if queue is None:  # no report for the model (not probed yet, or a node older than per-model reports)
        return _Node(None, 0.0, bounded=False)
    by_tier = queue.waiting_tokens_by_tier
    requests = queue.waiting_requests_by_tier
    if tier == "interactive" and by_tier:
        tokens, waiting = by_tier.get("interactive", 0), requests.get("interactive", 0)
    else:
        tokens, waiting = max(queue.waiting_tokens, sum(by_tier.values())), sum(requests.values())
    bound = queue.queue_bound_tokens.get(tier)
    queued_for_tier = by_tier.get(tier, queue.waiting_tokens) if by_tier else queue.waiting_tokens
    engine = EngineQueue(
        waiting_requests=max(waiting, 0),
        waiting_tokens=max(tokens, 0),
        running=max(queue.num_running, 0),
        max_num_seqs=queue.max_num_seqs,
        max_num_batched_tokens=queue.max_num_batched_tokens,
        long_prefill_token_threshold=queue.long_prefill_token_threshold,
        step_cost=queue.step_cost,
        finish_rate=queue.finish_rate,
    )
    reported = 0.0 if queue.step_cost.measured else queue.first_token_s_by_tier.get(tier, 0.0)
    return _Node(engine, reported, bounded=bound is not None and queued_for_tier >= bound)


class QueueAhead(Protocol):
    """A node's queue in front of a new request (`queue_ahead`)."""

    def estimate(self, prompt_tokens: int, *, behind: bool = False) -> float: ...


@dataclass(frozen=True)
class _More:
    """A node's queue with requests its report does not count yet."""

    node: _Node
    requests: int
    tokens: int
    running: int = 0

    def estimate(self, prompt_tokens: int, *, behind: bool = False) -> float:
        return self.node.estimate(
            prompt_tokens, self.requests, self.tokens, behind=behind, more_running=self.running
        )


def queue_ahead(
    queue: ModelQueue | None, tier: TrafficTier, *, requests: int = 0, tokens: int = 0, running: int = 0
) -> QueueAhead:
    """What is in front of a new request on one node: its report's queue for the tier, plus
    `requests` more of `tokens` prompt tokens in all, and `running` more sequences generating
    (sent since the report was asked). Its `estimate(prompt_tokens)` is the node's time to that
    request's first token; math.inf when the tier's queue is at its bound."""
    node = _derived(queue, tier)
    return _More(node, requests, tokens, running) if requests or running else node


def node_first_token_s(queue: ModelQueue | None, tier: TrafficTier, prompt_tokens: int) -> float:
    """One node's estimate for a new request of `prompt_tokens` from its report alone."""
    return _derived(queue, tier).estimate(prompt_tokens)


_UNREPORTED = _Node(None, 0.0, bounded=False)


def _derived(queue: ModelQueue | None, tier: TrafficTier) -> _Node:
    """`_ahead`, kept on the report: admission and routing ask it of every node for every
    request, and it depends on the report alone."""
    if queue is None:
        return _UNREPORTED
    ahead = queue.derived.get(tier)
    if ahead is None:
        ahead = queue.derived[tier] = _ahead(queue, tier)
    return ahead


def pool_wait(
    fleet: FleetSnapshot,
    *,
    model: str,
    residency: Residency,
    tier: TrafficTier,
    prompt_tokens: int = 1,
    pending: Sequence[PendingRequest] = (),
    cached: Mapping[str, int] | None = None,
    not_ready: frozenset[str] = frozenset(),
    needs: frozenset[str] = frozenset(),
) -> PoolWait | None:
    """The pool's estimate for a new request of `prompt_tokens` (module docstring); None when no
    node may serve the request, in which case routing, not admission, has the answer (a 503 that
    says why). `pending`: the gateway's admitted requests for this model without a first token.
    `cached`: per node id, the request's tokens that node holds in its prefix cache (router.cost
    finds them), so only the rest is prefilled there: on a node that starts short prompts beside
    long ones, a cached prompt's wait is one step, where counting it whole would refuse it.
    `not_ready`: the node ids whose cached part is still being computed by a request queued there:
    the request waits for the prompts ahead first. `needs`: the capabilities the request asks
    for; a node not serving them all is no part of its pool (it would refuse the request)."""
    nodes = screen_nodes(
        fleet.nodes, model=model, residency=residency, exclude=frozenset(), needs=needs
    ).admitted
    if not nodes:
        return None
    ahead = [_derived(n.load.models.get(model) if n.load is not None else None, tier) for n in nodes]
    asked = [n.load.asked_at if n.load is not None else -math.inf for n in nodes]
    # The pending requests placed on each node so far: how many, and their prompt tokens.
    placed = [0] * len(nodes)
    placed_tokens = [0] * len(nodes)
    # Interactive requests wait behind pending interactive requests only; batch behind all.
    relevant = sorted(
        (p for p in pending if tier == "batch" or p.tier == "interactive"), key=lambda p: p.admitted_at
    )
    for request in relevant:
        unreported = [i for i, at in enumerate(asked) if request.admitted_at >= at]
        if not unreported:
            continue  # every node was asked after it was admitted: it is in their reports
        best = (
            unreported[0]
            if len(unreported) == 1
            else min(unreported, key=lambda i: ahead[i].estimate(request.tokens, placed[i], placed_tokens[i]))
        )
        placed[best] += 1
        placed_tokens[best] += request.tokens
    own = [max(prompt_tokens - cached.get(n.node_id, 0), 1) for n in nodes] if cached else None
    behind = [n.node_id in not_ready for n in nodes]
    wait_s, best = min(
        (node.estimate(own[i] if own else prompt_tokens, placed[i], placed_tokens[i], behind=behind[i]), i)
        for i, node in enumerate(ahead)
    )
    tokens = own[best] if own else prompt_tokens
    return PoolWait(
        wait_s=wait_s,
        nodes=len(nodes),
        idle=ahead[best].idle and placed[best] == 0,
        tokens=tokens,
        short=ahead[best].short(tokens) and not behind[best],
    )

"""Bounded queues per priority tier: may a new request join its model's queue?

A request is refused at once (never queued to time out) when it would push its tier's waiting
prompt tokens past the tier's bound, or, where a tier has a wait limit, when its estimated time to
first token is already past it. Tiers are admitted in PRIORITY_RANK order, so what is *ahead* of
a new request is its own tier's queue and every higher one's: an interactive request waits only
behind interactive work, a batch request behind everything.

The time to first token (`first_token_s`) is protocol/first_token.py's estimate, the one the
gateway runs too: a sequence slot (requests ahead take the free ones first; without one, running
sequences must finish at the rate they lately have), then the prefill steps of the prompt tokens
ahead and its own (`max_num_batched_tokens` per step, beside the running sequences' decode
tokens), each as long as the engine's fitted cost for that batch (drain.py's `step_cost`). A step
costs more as the batch grows (on a CPU above all), so the estimate grows with load even while
nothing waits: that is what a spike does first, before any queue forms. Without a measured step
cost (an engine that has not stepped yet) the steps part falls back to the tokens ahead over the
measured drain rate. An idle engine (nothing running, nothing waiting) is never refused by a wait
limit: it cannot serve a request sooner.

The refusal carries a Retry-After: for the token bound, the seconds the engine needs, at its drain
rate, to work the queue down far enough to admit the request; for the wait limit, the seconds the
estimate is over it. At least 1 s; `max_retry_after_s` when the rate is unknown, and never more.

Pure functions over numbers; AsyncEngine calls `check` under the lock that guards its queue counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol import first_token
from protocol.first_token import EngineQueue, StepCost
from regional_node.engine.errors import QueueFullError
from regional_node.engine.sequence import PRIORITY_RANK

# The Retry-After cap, and the wait reported for a queue when the drain rate is not known yet.
DEFAULT_MAX_RETRY_AFTER_S = 60


@dataclass(frozen=True)
class QueueLimits:
    """Per-tier limits on one engine's queue; a tier without an entry is unlimited."""

    max_waiting_tokens: Mapping[str, int] = field(default_factory=dict)
    max_wait_s: Mapping[str, float] = field(default_factory=dict)
    max_retry_after_s: int = DEFAULT_MAX_RETRY_AFTER_S


@dataclass(frozen=True)
class QueueState:
    """One engine's queue and pace, as admission reads them: the step thread's latest snapshot
    plus the adds it has not taken yet."""

    waiting_tokens: Mapping[str, int]  # per tier
    waiting_requests: Mapping[str, int] = field(default_factory=dict)  # per tier
    drain_tokens_per_s: float = 0.0  # drain.py; 0: not measured
    step_cost: StepCost = field(default_factory=StepCost)  # drain.py's fit; unmeasured: no step yet
    max_num_batched_tokens: int = 0  # 0: unknown
    max_num_seqs: int | None = None  # None: not limited
    finish_rate: float = 0.0  # requests finished per second while busy (drain.py's slot_rate)
    running: int = 0  # sequences running now
    long_prefill_token_threshold: int = 0  # the scheduler's partial prefills; 0: none

    def idle(self) -> bool:
        return (
            self.running == 0
            and not any(self.waiting_requests.values())
            and not any(self.waiting_tokens.values())
        )

    def ahead_of(self, tier: str) -> EngineQueue:
        """What a new `tier` request waits behind: its own tier's queue and every higher one's."""
        rank = PRIORITY_RANK[tier]
        return EngineQueue(
            waiting_requests=sum(n for t, n in self.waiting_requests.items() if PRIORITY_RANK[t] <= rank),
            waiting_tokens=tokens_ahead(self.waiting_tokens, tier),
            running=self.running,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            step_cost=self.step_cost,
            finish_rate=self.finish_rate,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
        )


def tokens_ahead(waiting: Mapping[str, int], tier: str) -> int:
    """Waiting tokens a new `tier` request waits behind: its own tier's and every higher tier's."""
    rank = PRIORITY_RANK[tier]
    return sum(tokens for other, tokens in waiting.items() if PRIORITY_RANK[other] <= rank)


def estimated_wait_s(tokens: int, drain_tokens_per_s: float, unknown_s: float) -> float:
    """Seconds to work through `tokens`; `unknown_s` when there are some but no measured rate."""
    if tokens <= 0:
        return 0.0
    if drain_tokens_per_s <= 0:
        return float(unknown_s)
    return tokens / drain_tokens_per_s


def first_token_s(state: QueueState, tier: str, num_tokens: int, unknown_s: float) -> float:
    """Estimated seconds from now to a new `tier` request's first token (module docstring)."""
    queue = state.ahead_of(tier)
    estimate = first_token.first_token_s(queue, num_tokens, unknown_s=unknown_s)
    if not state.step_cost.measured:
        estimate += estimated_wait_s(queue.waiting_tokens, state.drain_tokens_per_s, unknown_s)
    return estimate


def report(state: QueueState, limits: QueueLimits) -> dict[str, Any]:
    """The queue's part of an engine's `stats()` (the node's /load: protocol/load.py's ModelLoad),
    the same keys for every engine: the queue per tier, its bounds, the inputs of the
    time-to-first-token estimate (so the gateway can run it again with its own admissions added),
    and the estimate itself per tier (`queue_wait_s`: the lowest tier's, which waits behind all)."""
    unknown = limits.max_retry_after_s
    first = {tier: first_token_s(state, tier, 0, unknown) for tier in PRIORITY_RANK}
    return {
        "waiting_tokens_by_tier": dict(state.waiting_tokens),
        "waiting_requests_by_tier": dict(state.waiting_requests),
        "queue_bound_tokens": dict(limits.max_waiting_tokens),
        "drain_tokens_per_s": state.drain_tokens_per_s,
        "step_cost": state.step_cost,
        "finish_rate": state.finish_rate,
        "max_num_seqs": state.max_num_seqs,
        "max_num_batched_tokens": state.max_num_batched_tokens,
        "long_prefill_token_threshold": state.long_prefill_token_threshold,
        "first_token_s_by_tier": first,
        "queue_wait_s": max(first.values()),
    }


def retry_after_s(tokens: float, drain_tokens_per_s: float, cap: int) -> int:
    """Whole seconds to work through `tokens` at the measured rate, within [1, cap]."""
    if drain_tokens_per_s <= 0:
        return max(1, cap)
    return max(1, min(cap, math.ceil(tokens / drain_tokens_per_s)))


def check(limits: QueueLimits, state: QueueState, tier: str, num_tokens: int) -> None:
    """Raise QueueFullError if a `tier` request of `num_tokens` prompt tokens may not join the
    queue described by `state`."""
    waiting, drain = state.waiting_tokens, state.drain_tokens_per_s
    queued = waiting.get(tier, 0)
    higher = tokens_ahead(waiting, tier) - queued
    bound = limits.max_waiting_tokens.get(tier)
    # An empty queue always takes one request, so a prompt longer than the bound still runs.
    if bound is not None and queued > 0 and queued + num_tokens > bound:
        # Admitted once the tier's queue is down to bound - num_tokens (empty, for a request longer
        # than the bound); the higher tiers' waiting tokens are served before any of it.
        excess = queued - max(0, bound - num_tokens)
        wait = retry_after_s(higher + excess, drain, limits.max_retry_after_s)
        raise QueueFullError(
            f"The {tier} queue is full: {queued} prompt tokens are waiting and this request's "
            f"{num_tokens} would pass the bound of {bound}; retry in {wait}s.",
            tier=tier,
            reason="queue_tokens",
            retry_after_s=wait,
        )
    max_wait = limits.max_wait_s.get(tier)
    if max_wait is None or state.idle():
        return
    # An estimate resting on nothing measured (no step time, no drain or finish rate) is unknown,
    # not long: only the token bound applies then.
    expected = first_token_s(state, tier, num_tokens, unknown_s=0.0)
    if expected > max_wait:
        wait = max(1, min(limits.max_retry_after_s, math.ceil(expected - max_wait)))
        raise QueueFullError(
            f"The {tier} queue is full: the estimated time to first token of {expected:.2f}s is "
            f"past the limit of {max_wait:g}s; retry in {wait}s.",
            tier=tier,
            reason="queue_wait",
            retry_after_s=wait,
        )

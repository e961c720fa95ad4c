"""Bounded queues per priority tier: may a new request join its model's queue?

A request is refused at once (never queued to time out) when it would push its tier's waiting
prompt tokens past the tier's bound, or, where a tier has a wait limit, when the estimated wait
before its first step is already past it. Tiers are admitted in PRIORITY_RANK order, so the
tokens *ahead* of a new request are those of its own tier and every higher one: an interactive
request waits only behind interactive tokens, a batch request behind everything. The estimated
wait is those tokens over the engine's measured drain rate (drain.py).

The refusal carries a Retry-After: the seconds the engine needs, at that rate, to work the queue
down far enough to admit the request (at least 1 s; `max_retry_after_s` when the rate is unknown,
and never more than that).

Pure functions over numbers; AsyncEngine calls `check` under the lock that guards its queue counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

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


def retry_after_s(tokens: float, drain_tokens_per_s: float, cap: int) -> int:
    """Whole seconds to work through `tokens` at the measured rate, within [1, cap]."""
    if drain_tokens_per_s <= 0:
        return max(1, cap)
    return max(1, min(cap, math.ceil(tokens / drain_tokens_per_s)))


def check(
    limits: QueueLimits,
    waiting: Mapping[str, int],
    tier: str,
    num_tokens: int,
    drain_tokens_per_s: float,
) -> None:
    """Raise QueueFullError if a `tier` request of `num_tokens` prompt tokens may not join the
    queue whose waiting tokens per tier are `waiting`."""
    queued = waiting.get(tier, 0)
    higher = tokens_ahead(waiting, tier) - queued
    bound = limits.max_waiting_tokens.get(tier)
    # An empty queue always takes one request, so a prompt longer than the bound still runs.
    if bound is not None and queued > 0 and queued + num_tokens > bound:
        # Admitted once the tier's queue is down to bound - num_tokens (empty, for a request longer
        # than the bound); the higher tiers' waiting tokens are served before any of it.
        excess = queued - max(0, bound - num_tokens)
        wait = retry_after_s(higher + excess, drain_tokens_per_s, limits.max_retry_after_s)
        raise QueueFullError(
            f"The {tier} queue is full: {queued} prompt tokens are waiting and this request's "
            f"{num_tokens} would pass the bound of {bound}; retry in {wait}s.",
            tier=tier,
            reason="queue_tokens",
            retry_after_s=wait,
        )
    max_wait = limits.max_wait_s.get(tier)
    # With no measured rate the wait is unknown, not long: only the token bound applies then.
    if max_wait is not None and drain_tokens_per_s > 0:
        expected = (higher + queued) / drain_tokens_per_s
        if expected > max_wait:
            wait = retry_after_s(
                higher + queued - max_wait * drain_tokens_per_s, drain_tokens_per_s, limits.max_retry_after_s
            )
            raise QueueFullError(
                f"The {tier} queue is full: the estimated wait of {expected:.1f}s is past the limit "
                f"of {max_wait:g}s; retry in {wait}s.",
                tier=tier,
                reason="queue_wait",
                retry_after_s=wait,
            )

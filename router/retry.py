"""Failover planning: which targets are left after failures, and how long to wait between tries.

Failover never re-routes outside the decision: `next_targets` only filters the decision's own
list, so a retry cannot reach a target the residency screen did not admit.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

from router.types import RouteDecision, Target

# However a policy is configured, one request never makes more upstream attempts than this:
# past a handful, the client has waited long enough that a clean error serves it better.
MAX_ATTEMPTS_BOUND = 10


def backoff_delays(attempts: int, base: float, cap: float, rng: random.Random) -> tuple[float, ...]:
    """Seconds to wait before each retry of `attempts` attempts in all (so attempts - 1 delays).

    "Full jitter": retry i waits uniform(0, min(cap, base * 2**i)), which spreads retries from many
    clients instead of synchronising them (AWS Architecture Blog, "Exponential Backoff and
    Jitter"). `attempts` is clamped to [1, MAX_ATTEMPTS_BOUND].
    """
    assert base >= 0.0 and cap >= 0.0, "backoff base and cap must not be negative"
    attempts = min(max(attempts, 1), MAX_ATTEMPTS_BOUND)
    return tuple(rng.uniform(0.0, min(cap, base * 2**i)) for i in range(attempts - 1))


@dataclass(frozen=True)
class RetryPolicy:
    """How hard the gateway tries one request: at most `max_attempts` targets, in decision order,
    with full-jitter backoff between them."""

    max_attempts: int = 3
    base_delay: float = 0.05
    max_delay: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS_BOUND:
            raise ValueError(
                f"max_attempts must be between 1 and {MAX_ATTEMPTS_BOUND}, got {self.max_attempts}"
            )
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("base_delay and max_delay must not be negative")

    def delays(self, rng: random.Random) -> tuple[float, ...]:
        return backoff_delays(self.max_attempts, self.base_delay, self.max_delay, rng)

    def plan(self, decision: RouteDecision) -> tuple[Target, ...]:
        """The targets to try, in order: the decision's first `max_attempts`."""
        return decision.targets[: self.max_attempts]


def next_targets(decision: RouteDecision, failed_ids: Iterable[str]) -> tuple[Target, ...]:
    """The decision's targets not yet failed, in the decision's order."""
    failed = frozenset(failed_ids)
    return tuple(t for t in decision.targets if t.target_id not in failed)

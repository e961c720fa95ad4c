"""Who is admitted next: priority tier first, then the tenant with the least recent service.

This is the Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language Models"
(OSDI 2024): each tenant has a counter of the (weighted) tokens served to it; the waiting tenant with
the smallest counter goes next. A tenant that becomes active again is lifted to the smallest counter
among active tenants (or to the counter of the last tenant to leave, when none is active), so idle
time cannot be banked as credit and a newcomer cannot starve everyone else.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterator

from regional_node.engine.sequence import PRIORITY_RANK, Sequence


class VirtualTokenCounter:
    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0) -> None:
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight
        self._counters: dict[str, float] = {}
        self._active: dict[str, int] = {}  # tenant -> unfinished requests
        self._last_left = 0.0

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def arrive(self, tenant: str) -> None:
        if not self._active.get(tenant):
            floor = min((self._counters.get(t, 0.0) for t in self._active), default=self._last_left)
            self._counters[tenant] = max(self.counter(tenant), floor)
        self._active[tenant] = self._active.get(tenant, 0) + 1

    def depart(self, tenant: str) -> None:
        left = self._active.get(tenant, 0) - 1
        if left > 0:
            self._active[tenant] = left
        else:
            self._active.pop(tenant, None)
            self._last_left = self.counter(tenant)
            if len(self._counters) > 2 * len(self._active) + 64:
                self._forget_idle()

    def _forget_idle(self) -> None:
        """Drop idle tenants at or below the floor, so one-off tenants do not pile up forever.

        The floor (lowest active counter, else the last one to leave) never falls, and a returning
        tenant is lifted to it, so forgetting a counter that is not above it changes nothing.
        """
        floor = min((self._counters.get(t, 0.0) for t in self._active), default=self._last_left)
        self._counters = {t: c for t, c in self._counters.items() if t in self._active or c > floor}

    def charge(self, tenant: str, prompt_tokens: int, output_tokens: int) -> None:
        cost = self.prompt_weight * prompt_tokens + self.output_weight * output_tokens
        self._counters[tenant] = self.counter(tenant) + cost


class WaitingQueue:
    """FIFO per (tier, tenant); `peek` picks the head of the best tier's least-served tenant."""

    def __init__(self, vtc: VirtualTokenCounter) -> None:
        self._vtc = vtc
        self._tiers: list[dict[str, deque[Sequence]]] = [{} for _ in PRIORITY_RANK]
        self._len = 0
        self.num_tokens = 0
        self._tier_tokens = [0] * len(PRIORITY_RANK)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Sequence]:
        for tier in self._tiers:
            for queue in tier.values():
                yield from queue

    def push(self, seq: Sequence, *, front: bool = False) -> None:
        queue = self._tiers[seq.rank].setdefault(seq.tenant, deque())
        if front:
            queue.appendleft(seq)
        else:
            queue.append(seq)
        self._len += 1
        self.num_tokens += seq.num_tokens
        self._tier_tokens[seq.rank] += seq.num_tokens

    def peek(self, passed: Container[Sequence] = frozenset()) -> Sequence | None:
        """The next to admit; `passed`: sequences to look past (each tenant's first other one
        stands in its place)."""
        for tier in self._tiers:
            if not passed:
                if tier:
                    tenant = min(tier, key=lambda t: (self._vtc.counter(t), tier[t][0].arrival))
                    return tier[tenant][0]
                continue
            firsts = (next((seq for seq in queue if seq not in passed), None) for queue in tier.values())
            heads = [seq for seq in firsts if seq is not None]
            if heads:
                return min(heads, key=lambda s: (self._vtc.counter(s.tenant), s.arrival))
        return None

    def remove(self, seq: Sequence) -> None:
        tier = self._tiers[seq.rank]
        queue = tier[seq.tenant]
        if queue[0] is seq:
            queue.popleft()
        else:
            queue.remove(seq)
        if not queue:
            del tier[seq.tenant]
        self._len -= 1
        self.num_tokens -= seq.num_tokens
        self._tier_tokens[seq.rank] -= seq.num_tokens

    def requests_by_tier(self) -> dict[str, int]:
        """Waiting requests per priority tier (every tier present, 0 when empty)."""
        return {tier: sum(map(len, self._tiers[rank].values())) for tier, rank in PRIORITY_RANK.items()}

    def tokens_by_tier(self) -> dict[str, int]:
        """Waiting tokens per priority tier (every tier present, 0 when empty)."""
        return {tier: self._tier_tokens[rank] for tier, rank in PRIORITY_RANK.items()}

"""One traffic tier's gateway queue: bounded, with deadlines, round-robin across tenants."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from router.cost import Demand
from router.types import CatalogModel, TenantPolicy

if TYPE_CHECKING:
    from gateway.admission.controller import Admitted


@dataclass(eq=False)
class Waiter:
    """A request waiting for admission; `decided` gets its Admitted or its Overloaded."""

    tenant: TenantPolicy
    model: CatalogModel
    demand: Demand  # what the request asks of a node (its prompt and the prefixes it shares)
    enqueued_at: float
    deadline: float
    decided: asyncio.Future[Admitted] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class FairQueue:
    """FIFO per tenant; tenants take turns. `heads()` yields each tenant's oldest waiter, the
    tenant served longest ago first; `served()` sends a tenant to the back. So one tenant with a
    hundred waiters gets one admission per round, like a tenant with one."""

    def __init__(self, max_waiters: int) -> None:
        self.max_waiters = max_waiters
        self._tenants: OrderedDict[str, deque[Waiter]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def full(self) -> bool:
        return self._size >= self.max_waiters

    def push(self, waiter: Waiter) -> None:
        assert not self.full, "push onto a full queue"
        self._tenants.setdefault(waiter.tenant.tenant_id, deque()).append(waiter)
        self._size += 1

    def remove(self, waiter: Waiter) -> bool:
        """Take `waiter` out wherever it is; False if it was not queued (already decided)."""
        waiters = self._tenants.get(waiter.tenant.tenant_id)
        if waiters is None or waiter not in waiters:
            return False
        waiters.remove(waiter)
        self._size -= 1
        if not waiters:
            del self._tenants[waiter.tenant.tenant_id]
        return True

    def served(self, tenant_id: str) -> None:
        if tenant_id in self._tenants:
            self._tenants.move_to_end(tenant_id)

    def heads(self) -> list[Waiter]:
        return [waiters[0] for waiters in self._tenants.values()]

    def __iter__(self) -> Iterator[Waiter]:
        for waiters in self._tenants.values():
            yield from waiters

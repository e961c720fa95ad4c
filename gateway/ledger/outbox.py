"""The in-process event queue: where the in-process quota store (and a settlement that could not
reach Redis) puts usage events, for the same worker logic that reads the Redis streams.

Appends happen inside the store's settlement call, which runs to completion without awaiting, so
on one event loop an event is queued exactly when its settlement happens. One consumer (the
gateway's ledger task) peeks a batch, commits it, then removes it: a batch whose commit failed is
read again. Like the in-process quota counters, it lives only as long as the process.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.ledger.source import Delivery


class LocalOutbox:
    def __init__(self) -> None:
        self._events: deque[bytes] = deque()
        self._ready: asyncio.Event | None = None
        self.appended = 0

    def __len__(self) -> int:
        return len(self._events)

    def append(self, tenant_id: str, event: bytes) -> None:
        del tenant_id  # one queue for every tenant; the event names its tenant
        self._events.append(event)
        self.appended += 1
        if self._ready is not None:
            self._ready.set()

    async def read(self, max_events: int, wait_s: float) -> list[Delivery]:
        if not self._events and wait_s > 0:
            if self._ready is None:
                self._ready = asyncio.Event()
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), wait_s)
            except TimeoutError:
                return []
        count = min(max_events, len(self._events))
        return [Delivery(self._events[i], ("local", str(i))) for i in range(count)]

    async def ack(self, deliveries: list[Delivery]) -> None:
        # The only consumer acks what it read, oldest first, before reading again.
        for _ in deliveries:
            self._events.popleft()

    async def close(self) -> None:
        return None

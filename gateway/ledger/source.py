"""What the ledger worker reads from: Redis streams or the in-process outbox."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Delivery:
    """One event as read: its bytes and where to acknowledge it (stream key, entry id)."""

    data: bytes
    receipt: tuple[str, str]


class EventSource(Protocol):
    async def read(self, max_events: int, wait_s: float) -> list[Delivery]:
        """Up to `max_events` unacknowledged events; waits up to `wait_s` when there are none."""
        ...

    async def ack(self, deliveries: list[Delivery]) -> None:
        """Only after the events are committed: they are not delivered again."""
        ...

    async def close(self) -> None: ...

"""The ledger worker: events from a source (Redis streams or the in-process outbox) into the store.

At-least-once in, exactly-once totals out: a batch is committed in one store transaction that
skips request ids already stored, and acknowledged only after the commit. A worker killed after
the commit and before the acknowledgement gets the batch again (itself, or another consumer via
XAUTOCLAIM), and the store counts none of it twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import msgspec

from gateway.ledger.event import UsageEvent, decode_events
from gateway.ledger.source import Delivery, EventSource
from gateway.ledger.store.operations import LedgerStore

logger = logging.getLogger(__name__)

_DAY_MS = 86_400_000


@dataclass
class WorkerStats:
    batches: int = 0
    read: int = 0
    committed: int = 0  # new events (duplicates not counted)
    malformed: int = 0
    failures: int = 0


class LedgerWorker:
    def __init__(
        self,
        source: EventSource,
        store: LedgerStore,
        *,
        batch_size: int = 500,
        wait_s: float = 0.2,
        retention_days: int | None = None,
        purge_interval_s: float = 3600.0,
        error_backoff_s: float = 1.0,
    ) -> None:
        self.source = source
        self.store = store
        self._batch_size = batch_size
        self._wait_s = wait_s
        self._retention_days = retention_days
        self._purge_interval_s = purge_interval_s
        self._error_backoff_s = error_backoff_s
        self._next_purge = 0.0
        # One step at a time: the outbox has one consumer (its read peeks, its ack pops), and
        # the usage API's catch-up drains it while the worker task may be mid-step.
        self._stepping = asyncio.Lock()
        self.stats = WorkerStats()

    async def step(self, wait_s: float | None = None) -> int:
        """Read one batch, commit it, acknowledge it; the number of events read (0: none waiting)."""
        async with self._stepping:
            deliveries = await self.source.read(self._batch_size, self._wait_s if wait_s is None else wait_s)
            if not deliveries:
                return 0
            events = self._decode(deliveries)
            self.stats.committed += await self.store.commit(events)
            await self.source.ack(deliveries)
            self.stats.batches += 1
            self.stats.read += len(deliveries)
            return len(deliveries)

    def _decode(self, deliveries: list[Delivery]) -> list[UsageEvent]:
        events = []
        for delivery in deliveries:
            try:
                events.extend(decode_events(delivery.data))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                # Acknowledged with the batch: a poison entry must not block the stream forever.
                self.stats.malformed += 1
                logger.error("ledger: malformed usage event %s skipped: %s", delivery.receipt, exc)
        return events

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Commit everything waiting now (bounded by `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and await self.step(wait_s=0):
            pass

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Until cancelled, or until `stop` is set (checked between batches). Store or source
        failures are logged and retried after a back-off; the unacknowledged batch is read again
        (Redis: by XAUTOCLAIM once idle; outbox: at once)."""
        while stop is None or not stop.is_set():
            try:
                if 0 < await self.step() < self._batch_size:
                    # A part batch: let the next one fill for a poll interval rather than commit
                    # a trickle of one-event transactions while the gateway is busiest.
                    await asyncio.sleep(self._wait_s)
                await self._purge_if_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.failures += 1
                # A store or Redis outage repeats every back-off: one line each, no traceback.
                logger.warning(
                    "ledger worker: batch failed (%s: %s); retrying in %.1fs",
                    type(exc).__name__,
                    exc,
                    self._error_backoff_s,
                    exc_info=logger.isEnabledFor(logging.DEBUG),
                )
                await asyncio.sleep(self._error_backoff_s)

    async def _purge_if_due(self) -> None:
        if self._retention_days is None or time.monotonic() < self._next_purge:
            return
        self._next_purge = time.monotonic() + self._purge_interval_s
        before = int(time.time() * 1000) - self._retention_days * _DAY_MS
        deleted = await self.store.purge(before)
        if deleted:
            logger.info("ledger: purged %d rows older than %d days", deleted, self._retention_days)

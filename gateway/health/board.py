"""One breaker per target id (provider endpoint or node), optionally shared across replicas.

The request path only touches memory: `try_acquire` and `record` are synchronous. Openings and
throttles this replica decides are published to the shared store by owned background tasks;
a background loop reads the other replicas' marks every `sync_interval_s`. When the store is
slow or down both sides give up after its short timeout and local state carries on alone.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.health.config import BreakerConfig
from gateway.health.metrics import BreakerMetrics
from gateway.health.shared import Mark, SharedBreakerStore, SharedStoreUnavailable
from gateway.health.state import BreakerState, CircuitBreaker, Clock, Outcome, Permit, Rejection
from gateway.runtime.tasks import cancel_and_wait

logger = logging.getLogger(__name__)


class BreakerBoard:
    def __init__(
        self,
        default_config: BreakerConfig | None = None,
        *,
        store: SharedBreakerStore | None = None,
        metrics: BreakerMetrics | None = None,
        clock: Clock = time.time,
        sync_interval_s: float = 0.5,
    ) -> None:
        self._default_config = default_config or BreakerConfig()
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._sync_interval_s = sync_interval_s
        self._breakers: dict[str, CircuitBreaker] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sync_loop: asyncio.Task[None] | None = None
        self._store_down = False

    def register(self, target_id: str, config: BreakerConfig | None = None) -> CircuitBreaker:
        """Create the target's breaker with its own settings (idempotent for the same id)."""
        breaker = self._breakers.get(target_id)
        if breaker is None:
            breaker = CircuitBreaker(config or self._default_config, self._clock)
            self._breakers[target_id] = breaker
            if self._metrics is not None:
                self._metrics.watch(target_id, lambda b=breaker: int(b.state))
        return breaker

    def breaker(self, target_id: str) -> CircuitBreaker:
        return self._breakers.get(target_id) or self.register(target_id)

    def state(self, target_id: str) -> BreakerState:
        return self.breaker(target_id).state

    def available(self, target_id: str) -> bool:
        return self.breaker(target_id).available()

    def try_acquire(self, target_id: str) -> Permit | Rejection:
        result = self.breaker(target_id).try_acquire()
        if isinstance(result, Rejection) and self._metrics is not None:
            self._metrics.rejected(target_id, result.reason)
        return result

    def record(
        self, target_id: str, permit: Permit, outcome: Outcome, *, retry_after: float | None = None
    ) -> None:
        breaker = self.breaker(target_id)
        was_open, was_throttled = breaker.open_until, breaker.throttled_until
        breaker.record(permit, outcome, retry_after=retry_after)
        if self._store is None:
            return
        if breaker.open_until is not None and breaker.open_until != was_open:
            self._publish(target_id, "open", breaker.open_until)
        if breaker.throttled_until is not None and breaker.throttled_until != was_throttled:
            self._publish(target_id, "throttled", breaker.throttled_until)

    # -- sharing -----------------------------------------------------------------------------

    async def sync(self) -> None:
        """Apply the other replicas' marks once. Never raises for store trouble."""
        if self._store is None or not self._breakers:
            return
        try:
            marks = await self._store.fetch(list(self._breakers))
        except SharedStoreUnavailable as exc:
            self._note_store_down(exc)
            return
        self._note_store_up()
        for target_id, mark in marks.items():
            breaker = self._breakers.get(target_id)
            if breaker is None:
                continue
            if mark.open_until is not None:
                breaker.trip(mark.open_until)
            if mark.throttled_until is not None:
                breaker.throttle(mark.throttled_until)

    async def start(self) -> None:
        if self._store is not None and self._sync_loop is None:
            self._sync_loop = asyncio.create_task(self._run_sync(), name="breaker-sync")

    async def flush(self) -> None:
        """Wait for pending publications (tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        await cancel_and_wait(self._sync_loop)
        self._sync_loop = None
        # Publications are bounded by the store's timeout, so this cannot hang shutdown.
        await self.flush()

    async def _run_sync(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self._sync_interval_s)

    def _publish(self, target_id: str, mark: Mark, until: float) -> None:
        assert self._store is not None
        task = asyncio.get_running_loop().create_task(self._publish_one(target_id, mark, until))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish_one(self, target_id: str, mark: Mark, until: float) -> None:
        assert self._store is not None
        try:
            await self._store.publish(target_id, mark, until)
        except SharedStoreUnavailable as exc:
            self._note_store_down(exc)

    def _note_store_down(self, exc: Exception) -> None:
        # Log the first failure of a streak only: the sync loop would otherwise log twice a second.
        if not self._store_down:
            logger.warning("breaker store unavailable, using local breaker state: %s", exc)
        self._store_down = True

    def _note_store_up(self) -> None:
        if self._store_down:
            logger.info("breaker store reachable again")
        self._store_down = False

"""One breaker per target id (node or provider endpoint), optionally shared across replicas.

A gateway has one board for all its upstreams: nodes get the default (passive ejection) settings,
providers register their own. The request path only touches memory: `try_acquire` and `record`
are synchronous. Openings and throttles this replica decides are published to the shared store by
owned background tasks; a background loop reads the other replicas' marks every
`sync_interval_s`, so a target opened by one replica is open for all. When the store is slow or
down both sides give up after its short timeout and local state carries on alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from gateway.health.breaker import BreakerState, CircuitBreaker, Clock, Outcome, Permit, Rejection
from gateway.health.config import BreakerConfig
from gateway.health.metrics import BreakerMetrics
from gateway.health.shared import Mark, RedisBreakerStore, SharedBreakerStore, SharedStoreUnavailable
from gateway.runtime.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
        """Whether routing should offer the target (a snapshot's view: not counted as a refusal)."""
        return self.breaker(target_id).available()

    def is_open(self, target_id: str) -> bool:
        return self.breaker(target_id).state is BreakerState.OPEN

    def refusal(self, target_id: str) -> Rejection | None:
        """Why a call to the target would be refused now (counted as refused), or None."""
        return self._refused(target_id, self.breaker(target_id).refusal())

    def try_acquire(self, target_id: str) -> Permit | Rejection:
        return self._refused(target_id, self.breaker(target_id).try_acquire())

    def record(
        self, target_id: str, permit: Permit, outcome: Outcome, *, retry_after: float | None = None
    ) -> None:
        breaker = self.breaker(target_id)
        was_open, was_throttled = breaker.open_until, breaker.throttled_until
        breaker.record(permit, outcome, retry_after=retry_after)
        self._share(target_id, breaker, was_open, was_throttled)

    def record_break(self, target_id: str) -> None:
        """A call recorded as a success failed after all (its stream broke midway)."""
        breaker = self.breaker(target_id)
        was_open, was_throttled = breaker.open_until, breaker.throttled_until
        breaker.record_break()
        self._share(target_id, breaker, was_open, was_throttled)

    def _refused(self, target_id: str, result: T) -> T:
        if isinstance(result, Rejection) and self._metrics is not None:
            self._metrics.rejected(target_id, result.reason)
        return result

    def _share(
        self, target_id: str, breaker: CircuitBreaker, was_open: float | None, was_throttled: float | None
    ) -> None:
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
        if self._store is not None:
            await self._store.aclose()

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


def build_board(
    node_config: BreakerConfig,
    *,
    redis_url: str | None = None,
    store_timeout_s: float = 0.1,
    sync_interval_s: float = 0.5,
    metrics_registry: CollectorRegistry | None = None,
    clock: Clock = time.time,
) -> BreakerBoard:
    """The gateway's board: `node_config` for every target that registers no settings of its own
    (nodes), marks shared through the Redis at `redis_url` if given (a client the board opens and
    closes). Opens no connection: the first sync or publication does."""
    store = None
    if redis_url:
        client = Redis.from_url(
            redis_url, socket_timeout=store_timeout_s, socket_connect_timeout=store_timeout_s
        )
        store = RedisBreakerStore(client, timeout_s=store_timeout_s, clock=clock, owns_client=True)
    return BreakerBoard(
        node_config,
        store=store,
        metrics=BreakerMetrics(metrics_registry) if metrics_registry is not None else None,
        clock=clock,
        sync_interval_s=sync_interval_s,
    )

"""The admission controller: admit, degrade, queue or refuse a request against its tier's target.

A request's pool is the nodes that may serve its model for its tenant (residency included); its
estimate is router.overload.pool_wait for the request's traffic tier. With `target` the tier's
`target_ttft_s`:

- interactive: admitted while the estimate is at most the target. Over it, a tenant with
  `allow_degrade` is served by the small tier of the same family (router.degrade_model) when that
  pool's estimate is under the target; any other interactive request waits in the interactive
  queue.
- batch: admitted only when interactive load leaves room: no interactive request waits in the
  gateway or had to wait or was refused in the last `batch_holdoff_s`, the pool's interactive
  estimate is at most the interactive target, and its batch estimate at most the batch target.
  Otherwise it waits in the batch queue.
- the queues: bounded (`max_queue`; one more is refused at once), each waiter refused when its
  `queue_deadline_s` passes, tenants served round-robin (queue.py). Once a tier has waiters, a
  new request joins the queue instead of overtaking them. The queues are looked at again when an
  admitted request starts (its tokens leave the pending count), and by each waiter every
  `recheck_interval_s` (nodes report once per probe interval).

Admitted requests hold a Ticket: their prompt tokens count as pending on the pool
(router.overload's `pending_tokens`) until the request's first token or its end, so the gateway's
own admissions raise the estimate before the nodes' next reports do. Refusals carry a Retry-After
of the time the pool needs to get under the target at its drain rate (at least 1 s, at most
`max_retry_after_s`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.admission.errors import Overloaded, ShedReason
from gateway.admission.queue import FairQueue, Waiter
from gateway.config import AdmissionConfig
from gateway.metrics import GatewayMetrics
from router import degrade_model, pool_wait
from router.overload import PoolWait
from router.types import CatalogModel, FleetSnapshot, Residency, TenantPolicy, TrafficTier

TIERS: tuple[TrafficTier, ...] = ("interactive", "batch")


class Ticket:
    """An admitted request's prompt tokens, pending on its pool until `release()` (idempotent):
    call it at the first token, or when the request ends without one."""

    def __init__(
        self, controller: AdmissionController | None, key: tuple[str, TrafficTier], tokens: int
    ) -> None:
        self._controller = controller
        self._key = key
        self._tokens = tokens

    def release(self) -> None:
        controller, self._controller = self._controller, None
        if controller is not None:
            controller._release(self._key, self._tokens)


@dataclass(frozen=True)
class Admitted:
    model: CatalogModel  # what serves the request: its own model, or the small tier
    degraded_from: str | None  # the model it asked for, when degraded
    ticket: Ticket


class AdmissionController:
    def __init__(
        self,
        config: AdmissionConfig,
        fleet: Callable[[], FleetSnapshot],
        catalog: Sequence[CatalogModel],
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._fleet = fleet
        self._catalog = tuple(catalog)
        self._metrics = metrics
        self._clock = clock
        self._queues = {tier: FairQueue(config.tier(tier).max_queue) for tier in TIERS}
        self._pending: Counter[tuple[str, TrafficTier]] = Counter()
        # Until when batch is held back: interactive requests lately had to wait or were refused.
        self._batch_held_until = -math.inf
        for tier in TIERS:
            metrics.queue_length.labels(tier).set_function(lambda q=self._queues[tier]: len(q))
            for model in self._catalog:
                metrics.pool_wait.labels(model.name, tier).set_function(
                    lambda m=model.name, t=tier: self._fleet_wait(m, t)
                )

    # -- the request path ---------------------------------------------------------------------

    async def admit(self, tenant: TenantPolicy, model: CatalogModel, prompt_tokens: int) -> Admitted:
        """Admitted (maybe degraded) once the request may go upstream; raises Overloaded."""
        if not self._config.enabled:
            return Admitted(model, None, Ticket(None, (model.name, tenant.traffic_tier), 0))
        tier = tenant.traffic_tier
        queue = self._queues[tier]
        if not queue:
            admitted = self._decide(tenant, model, prompt_tokens)
            if admitted is not None:
                return admitted
        settings = self._config.tier(tier)
        if tier == "interactive":
            self.interactive_pressed()
        if settings.queue_deadline_s <= 0:
            raise self._shed(tenant, model, "over_target", waited_s=None)
        if queue.full:
            raise self._shed(tenant, model, "queue_full", waited_s=None)
        now = self._clock()
        waiter = Waiter(
            tenant, model, prompt_tokens, enqueued_at=now, deadline=now + settings.queue_deadline_s
        )
        queue.push(waiter)
        try:
            self.pump()
            return await self._wait(waiter)
        except asyncio.CancelledError:
            # The client left while waiting: leave the queue, or hand back the admission it won.
            decided = waiter.decided
            if not queue.remove(waiter) and decided.done() and decided.exception() is None:
                decided.result().ticket.release()
            raise

    async def _wait(self, waiter: Waiter) -> Admitted:
        while not waiter.decided.done():
            remaining = max(waiter.deadline - self._clock(), 0.0)
            await asyncio.wait({waiter.decided}, timeout=min(self._config.recheck_interval_s, remaining))
            if not waiter.decided.done():
                self.pump()
        return waiter.decided.result()

    def interactive_pressed(self) -> None:
        """An interactive request could not start at once (it queues, or it was refused here or by
        every node): hold batch back for `batch_holdoff_s` from now."""
        self._batch_held_until = max(self._batch_held_until, self._clock() + self._config.batch_holdoff_s)

    def pump(self) -> None:
        """Refuse the waiters whose deadline passed, then admit what the estimates allow, tenants
        taking turns, interactive before batch (batch is never admitted while interactive waits)."""
        now = self._clock()
        for tier in TIERS:
            queue = self._queues[tier]
            for waiter in [w for w in queue if w.deadline <= now]:
                queue.remove(waiter)
                waiter.decided.set_exception(
                    self._shed(waiter.tenant, waiter.model, "deadline", waited_s=now - waiter.enqueued_at)
                )
            admitted_one = True
            while queue and admitted_one:
                admitted_one = False
                for waiter in queue.heads():
                    if tier == "batch" and self._queues["interactive"]:
                        return
                    admitted = self._decide(waiter.tenant, waiter.model, waiter.tokens)
                    if admitted is None:
                        continue
                    queue.remove(waiter)
                    queue.served(waiter.tenant.tenant_id)
                    self._metrics.queue_wait.labels(tier, "admitted").observe(now - waiter.enqueued_at)
                    waiter.decided.set_result(admitted)
                    admitted_one = True

    # -- decisions ------------------------------------------------------------------------------

    def _decide(self, tenant: TenantPolicy, model: CatalogModel, tokens: int) -> Admitted | None:
        """Admitted now (maybe degraded), or None: the request must wait."""
        fleet = self._fleet()
        interactive = self._config.interactive.target_ttft_s
        if tenant.traffic_tier == "interactive":
            if _within(self._estimate(fleet, model.name, tenant.residency, "interactive"), interactive):
                return self._admitted(tenant, model, tokens, degraded_from=None)
            small = degrade_model(model.name, tenant, self._catalog)
            if small is not None:
                estimate = self._estimate(fleet, small.name, tenant.residency, "interactive")
                if estimate is not None and estimate.wait_s <= interactive:
                    return self._admitted(tenant, small, tokens, degraded_from=model.name)
            return None
        if self._queues["interactive"] or self._clock() < self._batch_held_until:
            return None
        if not _within(self._estimate(fleet, model.name, tenant.residency, "interactive"), interactive):
            return None
        if not _within(
            self._estimate(fleet, model.name, tenant.residency, "batch"), self._config.batch.target_ttft_s
        ):
            return None
        return self._admitted(tenant, model, tokens, degraded_from=None)

    def _admitted(
        self, tenant: TenantPolicy, model: CatalogModel, tokens: int, *, degraded_from: str | None
    ) -> Admitted:
        key = (model.name, tenant.traffic_tier)
        self._pending[key] += tokens
        if degraded_from is not None:
            self._metrics.labelled(self._metrics.degraded, tenant.tenant_id, tenant.traffic_tier).inc()
        return Admitted(model, degraded_from, Ticket(self, key, tokens))

    def _release(self, key: tuple[str, TrafficTier], tokens: int) -> None:
        self._pending[key] -= tokens
        if self._pending[key] <= 0:
            del self._pending[key]
        if any(self._queues.values()):
            self.pump()

    def _estimate(
        self, fleet: FleetSnapshot, model: str, residency: Residency, tier: TrafficTier
    ) -> PoolWait | None:
        # Interactive requests wait behind pending interactive tokens only (nodes schedule them
        # first); batch requests behind everything pending.
        pending = self._pending[(model, "interactive")]
        if tier == "batch":
            pending += self._pending[(model, "batch")]
        return pool_wait(
            fleet,
            model=model,
            residency=residency,
            tier=tier,
            fallback_drain_tokens_per_s=self._config.fallback_drain_tokens_per_s,
            pending_tokens=pending,
        )

    def _fleet_wait(self, model: str, tier: TrafficTier) -> float:
        estimate = self._estimate(self._fleet(), model, Residency(), tier)
        return estimate.wait_s if estimate is not None else math.nan

    def _shed(
        self, tenant: TenantPolicy, model: CatalogModel, reason: ShedReason, *, waited_s: float | None
    ) -> Overloaded:
        tier = tenant.traffic_tier
        self._metrics.labelled(self._metrics.shed, tenant.tenant_id, tier, reason).inc()
        if waited_s is not None:
            self._metrics.queue_wait.labels(tier, "shed").observe(waited_s)
        return Overloaded(
            model=model.name, tier=tier, reason=reason, retry_after_s=self._retry_after(tenant, model)
        )

    def _retry_after(self, tenant: TenantPolicy, model: CatalogModel) -> int:
        """Seconds until the pool is under the tier's target at its drain rate: [1, max]."""
        tier = tenant.traffic_tier
        estimate = self._estimate(self._fleet(), model.name, tenant.residency, tier)
        over = estimate.wait_s - self._config.tier(tier).target_ttft_s if estimate is not None else 0.0
        cap = self._config.max_retry_after_s
        return cap if not math.isfinite(over) else min(cap, max(1, math.ceil(over)))


def _within(estimate: PoolWait | None, target_s: float) -> bool:
    # No pool at all is routing's to answer (a 503 that says why), not admission's.
    return estimate is None or estimate.wait_s <= target_s

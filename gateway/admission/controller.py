"""The admission controller: admit, degrade, queue or refuse a request against its tier's target.

A request's pool is the nodes that may serve its model for its tenant (residency included); its
estimate is router.overload.pool_wait: the request's time to first token on the node where it
would start soonest, the way that node runs it (free slots, prefill steps of up to
max_num_batched_tokens at the node's fitted step cost), with the requests this gateway admitted
since the node's last report put ahead of it. With `target` the tier's `target_ttft_s`, a request
whose pool has nothing ahead of it is always admitted (no pool could start it sooner); otherwise:

- interactive: admitted while the estimate is at most the target, less the time the request has
  already waited in the gateway queue (so a waiter is admitted only while it can still start
  within its target, and waits no longer than the target). Over it, a tenant with
  `allow_degrade` is served by the small tier of the same family (router.degrade_model) when that
  pool's estimate is under the target; any other interactive request waits in the interactive
  queue.
- batch: admitted only when interactive load leaves room: no interactive request waits in the
  gateway or had to wait or was refused in the last `batch_holdoff_s`, the pool's interactive
  estimate is at most the interactive target, and its batch estimate at most the batch target.
  Otherwise it waits in the batch queue.
- the queues: bounded (`max_queue`; one more is refused at once), each waiter refused once it
  has waited `queue_deadline_s` (or the tier's target, if shorter), tenants served round-robin (queue.py). Once a tier has waiters, a
  new request joins the queue instead of overtaking them. The queues are looked at again when an
  admitted request starts (its tokens leave the pending count), and by each waiter every
  `recheck_interval_s` (nodes report once per probe interval).

Admitted requests hold a Ticket: they count as pending on the pool (router.overload's
`pending`) until the request's first token (`started`) or its end (`release`), so the gateway's
own admissions raise the estimate before the nodes' next reports do. At the first token the
ticket records how far the TTFT that followed was from the estimate admission decided on
(`meridian_gateway_admission_estimate_error_seconds`), and the pool's recent error corrects its
next estimates (feedback.py). Refusals carry a Retry-After of the
seconds the estimate is over the target (at least 1 s, at most `max_retry_after_s`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.admission.errors import Overloaded, ShedReason
from gateway.admission.feedback import EstimateFeedback
from gateway.admission.queue import FairQueue, Waiter
from gateway.config import AdmissionConfig
from gateway.metrics import GatewayMetrics
from router import PendingRequest, PoolWait, degrade_model, pool_wait
from router.cost import Demand, held
from router.types import CatalogModel, FleetSnapshot, Residency, TenantPolicy, TrafficTier

TIERS: tuple[TrafficTier, ...] = ("interactive", "batch")


class Ticket:
    """An admitted request, pending on its pool until its first token (`started`) or its end
    without one (`release`); either is idempotent, and the first one called counts."""

    def __init__(
        self,
        controller: AdmissionController | None,
        model: str,
        request: PendingRequest,
        estimate: PoolWait | None = None,
        correction_s: float = 0.0,
    ) -> None:
        self._controller = controller
        self._model = model
        self._request = request
        self._estimate = estimate  # the raw estimate admission decided on, with `correction_s`
        self._correction_s = correction_s

    def started(self) -> None:
        """The first token is here: record the estimate's error, and leave the pool's pending."""
        controller, self._controller = self._controller, None
        if controller is not None:
            controller._started(self._model, self._request, self._estimate, self._correction_s)

    def release(self) -> None:
        controller, self._controller = self._controller, None
        if controller is not None:
            controller._release(self._model, self._request)


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
        # By model: the admitted requests without a first token yet, by id() (each is kept alive here).
        self._pending: defaultdict[str, dict[int, PendingRequest]] = defaultdict(dict)
        self._feedback = EstimateFeedback()
        # Until when batch is held back: interactive requests lately had to wait or were refused.
        self._batch_held_until = -math.inf
        for tier in TIERS:
            metrics.queue_length.labels(tier).set_function(lambda q=self._queues[tier]: len(q))
            for model in self._catalog:
                metrics.pool_wait.labels(model.name, tier).set_function(
                    lambda m=model.name, t=tier: self._fleet_wait(m, t)
                )

    # -- the request path ---------------------------------------------------------------------

    async def admit(
        self,
        tenant: TenantPolicy,
        model: CatalogModel,
        prompt_tokens: int,
        conversation: tuple[tuple[str, str], ...] = (),
        needs: frozenset[str] = frozenset(),
    ) -> Admitted:
        """Admitted (maybe degraded) once the request may go upstream; raises Overloaded.
        `conversation`: a chat's messages (protocol.prefix_cache.conversation_of), so the estimate
        counts only the prompt a node does not hold cached. `needs`: the capabilities it asks
        for; its pool is the nodes serving them all (none: a provider's request, not judged here)."""
        if not self._config.enabled:
            request = PendingRequest(prompt_tokens, tenant.traffic_tier, self._clock())
            return Admitted(model, None, Ticket(None, model.name, request))
        demand = Demand.of(tenant, prompt_tokens, conversation, needs)
        tier = tenant.traffic_tier
        queue = self._queues[tier]
        if not queue:
            admitted = self._decide(tenant, model, demand)
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
        # A waiter is admitted only while it can still start within its target (the wait counts),
        # so it waits no longer than the target either.
        patience = min(settings.queue_deadline_s, settings.target_ttft_s)
        waiter = Waiter(tenant, model, demand, enqueued_at=now, deadline=now + patience)
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
                    waited = now - waiter.enqueued_at
                    admitted = self._decide(waiter.tenant, waiter.model, waiter.demand, waited_s=waited)
                    if admitted is None:
                        continue
                    queue.remove(waiter)
                    queue.served(waiter.tenant.tenant_id)
                    self._metrics.queue_wait.labels(tier, "admitted").observe(now - waiter.enqueued_at)
                    waiter.decided.set_result(admitted)
                    admitted_one = True

    # -- decisions ------------------------------------------------------------------------------

    def _decide(
        self, tenant: TenantPolicy, model: CatalogModel, demand: Demand, *, waited_s: float = 0.0
    ) -> Admitted | None:
        """Admitted now (maybe degraded), or None: the request must wait. `waited_s`: how long it
        has waited in the gateway queue, which its time to first token includes."""
        fleet = self._fleet()
        interactive = self._config.interactive.target_ttft_s
        if tenant.traffic_tier == "interactive":
            left = interactive - waited_s
            estimate = self._estimate(fleet, model.name, tenant.residency, "interactive", demand)
            if self._within(estimate, model.name, "interactive", left):
                return self._admitted(tenant, model, demand, estimate, degraded_from=None)
            small = degrade_model(model.name, tenant, self._catalog)
            if small is not None:
                estimate = self._estimate(fleet, small.name, tenant.residency, "interactive", demand)
                if estimate is not None and self._within(estimate, small.name, "interactive", left):
                    return self._admitted(tenant, small, demand, estimate, degraded_from=model.name)
            return None
        if self._queues["interactive"] or self._clock() < self._batch_held_until:
            return None
        # Batch goes only where interactive load leaves room.
        interactive_now = self._estimate(fleet, model.name, tenant.residency, "interactive", demand)
        if not self._within(interactive_now, model.name, "interactive", interactive):
            return None
        estimate = self._estimate(fleet, model.name, tenant.residency, "batch", demand)
        if not self._within(estimate, model.name, "batch", self._config.batch.target_ttft_s - waited_s):
            return None
        return self._admitted(tenant, model, demand, estimate, degraded_from=None)

    def _within(self, estimate: PoolWait | None, model: str, tier: TrafficTier, budget_s: float) -> bool:
        """May a request start: no pool at all is routing's to answer (a 503 that says why), not
        admission's; a pool with nothing ahead of the request starts it as soon as any could;
        otherwise its estimate, corrected by what the pool's estimates lately missed by, must
        fit the time the request has left."""
        if estimate is None or estimate.idle:
            return True
        return self._corrected_s(estimate, model, tier) <= budget_s

    def _corrected_s(self, estimate: PoolWait, model: str, tier: TrafficTier) -> float:
        correction = self._feedback.correction_s(model, tier, self._clock(), short=estimate.short)
        return max(estimate.wait_s + correction, 0.0)

    def _admitted(
        self,
        tenant: TenantPolicy,
        model: CatalogModel,
        demand: Demand,
        estimate: PoolWait | None,
        *,
        degraded_from: str | None,
    ) -> Admitted:
        now, tier = self._clock(), tenant.traffic_tier
        if estimate is None:
            # No node may serve it (none is up, or none serves what it asks: a provider will):
            # it waits on no pool, so it is pending on none.
            return Admitted(
                model,
                degraded_from,
                Ticket(None, model.name, PendingRequest(demand.prompt_tokens, tier, now)),
            )
        # Pending on the pool with what it will prefill where it starts soonest (cache hits off).
        request = PendingRequest(estimate.tokens, tier, now)
        self._pending[model.name][id(request)] = request
        if degraded_from is not None:
            self._metrics.labelled(self._metrics.degraded, tenant.tenant_id, tier).inc()
        correction = self._feedback.correction_s(model.name, tier, now, short=estimate.short)
        return Admitted(model, degraded_from, Ticket(self, model.name, request, estimate, correction))

    def _started(
        self, model: str, request: PendingRequest, estimate: PoolWait | None, correction_s: float
    ) -> None:
        # An idle pool's estimate did not decide anything, but it is still one to learn from.
        if estimate is not None and math.isfinite(estimate.wait_s):
            now = self._clock()
            observed = now - request.admitted_at
            decided = max(estimate.wait_s + correction_s, 0.0)
            self._metrics.admission_estimate_error.labels(model, request.tier).observe(observed - decided)
            self._feedback.observe(model, request.tier, observed - estimate.wait_s, now, short=estimate.short)
        self._release(model, request)

    def _release(self, model: str, request: PendingRequest) -> None:
        pending = self._pending[model]
        pending.pop(id(request), None)
        if not pending:
            del self._pending[model]
        if any(self._queues.values()):
            self.pump()

    def _estimate(
        self, fleet: FleetSnapshot, model: str, residency: Residency, tier: TrafficTier, demand: Demand
    ) -> PoolWait | None:
        pending = self._pending.get(model)
        prompt = held(demand, model, fleet.nodes)
        return pool_wait(
            fleet,
            model=model,
            residency=residency,
            tier=tier,
            prompt_tokens=prompt.prompt_tokens,
            pending=tuple(pending.values()) if pending else (),
            cached=prompt.cached,
            not_ready=prompt.not_ready,
            needs=demand.needs,
        )

    def _fleet_wait(self, model: str, tier: TrafficTier) -> float:
        estimate = self._estimate(self._fleet(), model, Residency(), tier, Demand())
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
        """The seconds the pool's estimate is over the tier's target: [1, max]."""
        tier = tenant.traffic_tier
        estimate = self._estimate(self._fleet(), model.name, tenant.residency, tier, Demand())
        target = self._config.tier(tier).target_ttft_s
        over = self._corrected_s(estimate, model.name, tier) - target if estimate is not None else 0.0
        cap = self._config.max_retry_after_s
        return cap if not math.isfinite(over) else min(cap, max(1, math.ceil(over)))

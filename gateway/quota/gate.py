"""The QuotaGate the gateway calls: policy -> one store operation -> Admission or a quota error.

With a shared (Redis) store, a breaker decides whether to ask it; when it cannot answer, the
tenant's fail_mode decides: "closed" -> QuotaUnavailable, "open" -> an in-process store enforcing
`local_share` of each limit (this replica's part of it).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gateway.health import (
    BreakerConfig,
    BreakerState,
    CircuitBreaker,
    ConsecutiveFailures,
    Cooldown,
    Outcome,
    Rejection,
)
from gateway.quota import reference
from gateway.quota.errors import QuotaExceeded, QuotaStoreUnavailable, QuotaUnavailable, RequestTooLarge
from gateway.quota.headers import denial_message, rate_limit_headers
from gateway.quota.interface import Admission
from gateway.quota.model import QuotaLimits, Ticket
from gateway.quota.report import usage_report
from gateway.quota.store import Outbox, QuotaStore
from gateway.quota.window import Geometry
from router.types import TenantPolicy

logger = logging.getLogger(__name__)

T = TypeVar("T")
LOCAL = "local"  # Ticket.source of admissions the fail-open fallback made


def check_can_ever_fit(tenant_id: str, limits: QuotaLimits, cost: int) -> None:
    """A request whose estimate alone exceeds a token limit would be refused forever: say so
    with a 400 rather than a 429 that clients (and OpenAI's SDKs) would keep retrying."""
    for limit, what in (
        (limits.tokens_per_minute, "tokens per minute"),
        (limits.daily_tokens, "tokens per day"),
    ):
        if limit is not None and cost > limit:
            raise RequestTooLarge(tenant_id, cost=cost, limit=limit, what=what)


class StoreQuotaGate:
    def __init__(
        self,
        store: QuotaStore,
        *,
        fallback: QuotaStore | None = None,
        breaker: CircuitBreaker | None = None,
        lease_ms: int = 30_000,
        local_share: float = 0.25,
        geometry: Geometry | None = None,
        outbox: Outbox | None = None,
    ):
        """`fallback` (with `breaker`) only for a store that can fail, i.e. Redis. `outbox` takes the
        usage event of a settlement that could not reach Redis (the ledger's in-process queue)."""
        self._store = store
        self._outbox = outbox
        self._fallback = fallback
        self._breaker = breaker or store_breaker(1.0)
        self._lease_ms = lease_ms
        self._local_share = local_share
        self._geo = geometry or Geometry()
        self.dropped_settlements = 0

    @property
    def lease_ms(self) -> int:
        return self._lease_ms

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        """Ask the primary store through the breaker; QuotaStoreUnavailable if it cannot answer."""
        if self._fallback is None:
            return await call()  # the in-process store cannot be unreachable
        permit = self._breaker.try_acquire()
        if isinstance(permit, Rejection):
            raise QuotaStoreUnavailable("quota store skipped while its breaker is open")
        try:
            result = await call()
        except QuotaStoreUnavailable as exc:
            if self._breaker.state is BreakerState.CLOSED:
                logger.warning("quota store unreachable, applying tenants' fail_mode: %s", exc)
            self._breaker.record(permit, Outcome.FAILURE)
            raise
        except BaseException:
            self._breaker.record(permit, Outcome.NEUTRAL)  # no answer either way: let another call probe
            raise
        was_down = self._breaker.state is not BreakerState.CLOSED
        self._breaker.record(permit, Outcome.SUCCESS)
        if was_down and self._breaker.state is BreakerState.CLOSED:
            logger.warning("quota store reachable again")
        return result

    def _unavailable(self, tenant_id: str) -> QuotaUnavailable:
        wait_ms = max(1_000, int(self._breaker.retry_after_s() * 1000))
        return QuotaUnavailable(tenant_id, retry_after_ms=wait_ms)

    async def start(self) -> None:
        """Warm the shared store (scripts, connections), if it has anything to warm."""
        start = getattr(self._store, "start", None)
        if start is not None:
            await start()

    async def admit(self, policy: TenantPolicy, *, request_id: str, estimated_tokens: int) -> Admission:
        tenant_id = policy.tenant_id
        limits = QuotaLimits.from_tenant(policy.limits)
        cost = max(0, int(estimated_tokens))
        check_can_ever_fit(tenant_id, limits, cost)
        lease_id = f"{request_id}:{os.urandom(6).hex()}"  # unique even if request ids repeat
        store, source = self._store, self._store.name
        try:
            outcome = await self._guarded(
                lambda: store.admit(tenant_id, limits, cost, lease_id, self._lease_ms)
            )
        except QuotaStoreUnavailable:
            if policy.fail_mode == "closed" or self._fallback is None:
                raise self._unavailable(tenant_id) from None
            store, source, limits = self._fallback, LOCAL, limits.scaled(self._local_share)
            outcome = await store.admit(tenant_id, limits, cost, lease_id, self._lease_ms)

        headers = rate_limit_headers(limits, outcome)
        if source == LOCAL:
            headers["x-meridian-quota"] = "local"  # degraded: this replica's share only
        if not outcome.admitted:
            raise QuotaExceeded(
                tenant_id,
                denial_message(tenant_id, limits, outcome, cost),
                headers=headers,
                retry_after_ms=outcome.retry_after_ms,
            )
        capped = limits.concurrent_requests is not None
        ticket = Ticket(
            tenant_id=tenant_id,
            source=source,
            slot=outcome.slot,
            day=outcome.day,
            lease_ms=self._lease_ms,
            concurrent_limit=limits.concurrent_requests,
        )
        return Admission(
            tenant_id=tenant_id,
            request_id=request_id,
            reserved_tokens=cost,
            headers=headers,
            lease_id=lease_id if capped else None,
            store_state=ticket,
        )

    def _store_for(self, ticket: Ticket) -> QuotaStore:
        if ticket.source == LOCAL and self._fallback is not None:
            return self._fallback
        return self._store

    async def renew(self, admission: Admission) -> None:
        ticket = admission.store_state
        if admission.lease_id is None or ticket.settled:
            return
        store = self._store_for(ticket)
        limit = ticket.concurrent_limit if ticket.concurrent_limit is not None else 0
        call = lambda: store.renew(ticket.tenant_id, admission.lease_id or "", ticket.lease_ms, limit)  # noqa: E731
        try:
            result = await (call() if store is self._fallback else self._guarded(call))
        except QuotaStoreUnavailable:
            return  # the lease runs on until its expiry; the next renewal may get through
        if result == reference.LOST:
            logger.warning(
                "lease %s of tenant %s expired and its slot was taken", admission.lease_id, ticket.tenant_id
            )

    async def settle(self, admission: Admission, *, actual_tokens: int, event: bytes | None = None) -> None:
        ticket = admission.store_state
        if ticket.settled:
            return
        ticket.settled = True
        # The request path shields this call (gateway.runtime.tasks.run_shielded): a request
        # cancelled mid-settlement (client gone) still releases its slot.
        store = self._store_for(ticket)
        delta = int(actual_tokens) - admission.reserved_tokens
        lease_id = admission.lease_id or ""
        call = lambda: store.settle(ticket.tenant_id, ticket.slot, ticket.day, delta, lease_id, event)  # noqa: E731
        try:
            await (call() if store is self._fallback else self._guarded(call))
        except QuotaStoreUnavailable as exc:
            # Safe to drop: the reservation ages out of the window and the lease expires. The
            # usage event is not: it goes to the in-process outbox, which the ledger drains.
            if event is not None and self._outbox is not None:
                self._outbox.append(ticket.tenant_id, event)
            self.dropped_settlements += 1
            logger.warning(
                "dropped settlement of request %s (tenant %s, delta %d tokens): %s",
                admission.request_id,
                ticket.tenant_id,
                delta,
                exc,
            )

    async def usage(self, policy: TenantPolicy) -> dict[str, Any]:
        tenant_id = policy.tenant_id
        limits = QuotaLimits.from_tenant(policy.limits)
        try:
            reading = await self._guarded(lambda: self._store.read(tenant_id))
            source = self._store.name
        except QuotaStoreUnavailable:
            if policy.fail_mode == "closed" or self._fallback is None:
                raise self._unavailable(tenant_id) from None
            limits = limits.scaled(self._local_share)
            reading, source = await self._fallback.read(tenant_id), LOCAL
        return usage_report(tenant_id, limits, reading, source=source, geometry=self._geo)

    async def close(self) -> None:
        await self._store.close()
        if self._fallback is not None:
            await self._fallback.close()


def store_breaker(cooldown_s: float, *, clock: Callable[[], float] = time.monotonic) -> CircuitBreaker:
    """When to skip the shared store: after a failure, calls skip it for `cooldown_s` (they go
    straight to the tenant's fail_mode, so nobody waits on a dead Redis); then exactly one call
    probes it while the others keep skipping, and the probe's result closes or re-opens the
    breaker. This is how the gateway goes back to Redis by itself once it returns."""
    config = BreakerConfig(opens=ConsecutiveFailures(1), cooldown=Cooldown(cooldown_s), half_open_probes=1)
    return CircuitBreaker(config, clock)

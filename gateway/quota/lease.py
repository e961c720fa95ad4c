"""Keeping a long request's concurrency lease alive while it runs."""

from __future__ import annotations

import asyncio
import logging

from gateway.quota.interface import Admission, QuotaGate

logger = logging.getLogger(__name__)


def default_renew_interval_s(lease_ms: int) -> float:
    """Three renewals per lease, so two in a row may fail before the lease lapses."""
    return max(0.05, lease_ms / 3000)


class LeaseKeeper:
    """Renew `admission`'s lease every `interval` seconds (default: a third of the lease) until the
    block exits. Without a lease (no concurrency cap) it does nothing, and costs nothing: a class
    rather than an @asynccontextmanager generator, as it runs on every request. Renewal errors are
    logged, never raised into the request: the lease simply expires, as it would if this process
    died."""

    def __init__(self, gate: QuotaGate, admission: Admission, interval: float | None = None) -> None:
        self._gate = gate
        self._admission = admission
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        admission = self._admission
        if admission.lease_id is None:
            return
        if self._interval is None:
            self._interval = default_renew_interval_s(admission.store_state.lease_ms)
        self._task = asyncio.create_task(self._keep(), name=f"lease-keeper-{admission.request_id}")

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is None:
            return
        self._task.cancel()
        # wait(), not `await task`: it never raises the task's CancelledError, so a cancellation
        # of the request itself is not swallowed here.
        await asyncio.wait([self._task])

    async def _keep(self) -> None:
        assert self._interval is not None
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self._gate.renew(self._admission)
            except Exception:
                logger.exception("renewing lease %s failed", self._admission.lease_id)

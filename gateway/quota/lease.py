"""Keeping a long request's concurrency lease alive while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from gateway.quota.interface import Admission, QuotaGate

logger = logging.getLogger(__name__)


def default_renew_interval_s(lease_ms: int) -> float:
    """Three renewals per lease, so two in a row may fail before the lease lapses."""
    return max(0.05, lease_ms / 3000)


@contextlib.asynccontextmanager
async def lease_keeper(
    gate: QuotaGate, admission: Admission, interval: float | None = None
) -> AsyncIterator[None]:
    """Renew `admission`'s lease every `interval` seconds (default: a third of the lease) until the
    block exits. Without a lease (no concurrency cap) it does nothing. Renewal errors are logged,
    never raised into the request: the lease simply expires, as it would if this process died."""
    if admission.lease_id is None:
        yield
        return
    if interval is None:
        interval = default_renew_interval_s(admission.store_state.lease_ms)

    async def keep() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await gate.renew(admission)
            except Exception:
                logger.exception("renewing lease %s failed", admission.lease_id)

    task = asyncio.create_task(keep(), name=f"lease-keeper-{admission.request_id}")
    try:
        yield
    finally:
        task.cancel()
        # wait(), not `await task`: it never raises the task's CancelledError, so a cancellation
        # of the request itself is not swallowed here.
        await asyncio.wait([task])

"""LeaseKeeper keeps a long request's slot past its lease, and stops with the request."""

from __future__ import annotations

import asyncio

import pytest

from gateway.quota import LeaseKeeper, MemoryQuotaStore, QuotaExceeded, StoreQuotaGate
from tests.quota.conftest import make_policy


async def test_kept_lease_outlives_its_expiry_and_lapses_after_the_block() -> None:
    gate = StoreQuotaGate(MemoryQuotaStore(), lease_ms=300)
    policy = make_policy(concurrent_requests=1)
    admission = await gate.admit(policy, request_id="long", estimated_tokens=1)
    async with LeaseKeeper(gate, admission, interval=0.1):
        await asyncio.sleep(0.8)  # well past the 300 ms lease
        with pytest.raises(QuotaExceeded):
            await gate.admit(policy, request_id="other", estimated_tokens=1)
    await asyncio.sleep(0.4)  # no settle: the lease must lapse now that nobody renews it
    await gate.admit(policy, request_id="later", estimated_tokens=1)


async def test_keeper_without_a_lease_starts_no_task() -> None:
    gate = StoreQuotaGate(MemoryQuotaStore())
    admission = await gate.admit(make_policy(requests_per_minute=5), request_id="a", estimated_tokens=1)
    before = len(asyncio.all_tasks())
    async with LeaseKeeper(gate, admission):
        assert len(asyncio.all_tasks()) == before

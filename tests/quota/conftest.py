"""Fixtures for the quota tests: a controllable clock and the gate over each store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from gateway.quota import MemoryQuotaStore, RedisQuotaStore, StoreQuotaGate, store_breaker
from gateway.quota.redis_store import connect
from router.types import FailMode, TenantLimits, TenantPolicy

# Noon UTC, so a test that does not move the clock far never crosses a day boundary.
NOON_MS = 1_700_049_600_000


class FakeClock:
    """Milliseconds since the epoch, moved only by the test."""

    def __init__(self, now_ms: int = NOON_MS):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def make_policy(fail_mode: FailMode = "open", tenant_id: str | None = None, **limits: int) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=tenant_id or f"t-{uuid.uuid4().hex[:10]}",
        api_key_hashes=frozenset(),
        limits=TenantLimits(**limits),
        fail_mode=fail_mode,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def gate(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[StoreQuotaGate]:
    """The same gate over the in-process store and over Redis (scripts given the fake clock)."""
    if request.param == "memory":
        built = StoreQuotaGate(MemoryQuotaStore(clock=clock), lease_ms=2_000)
    else:
        url = request.getfixturevalue("redis_server")
        store = RedisQuotaStore(connect(url, timeout_s=1.0), key_prefix="mqtest", timeout_s=1.0, clock=clock)
        built = StoreQuotaGate(
            store,
            fallback=MemoryQuotaStore(name="local", clock=clock),
            breaker=store_breaker(1.0),
            lease_ms=2_000,
        )
    yield built
    await built.close()

"""The Lua scripts compute exactly what the Python reference computes, op for op."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.quota import MemoryQuotaStore, QuotaLimits, RedisQuotaStore
from gateway.quota.redis_store import connect
from tests.quota.conftest import FakeClock

limit = st.one_of(st.none(), st.integers(min_value=0, max_value=40))
limits = st.builds(
    QuotaLimits,
    requests_per_minute=limit,
    tokens_per_minute=st.one_of(st.none(), st.integers(min_value=0, max_value=400)),
    concurrent_requests=st.one_of(st.none(), st.integers(min_value=0, max_value=4)),
    daily_tokens=st.one_of(st.none(), st.integers(min_value=0, max_value=2000)),
)
# (kind, clock step ms, cost or delta, index of an earlier admission)
op = st.tuples(
    st.sampled_from(["admit", "admit", "settle", "renew", "read"]),
    # Steps that land on bucket and window edges, where off-by-one errors live.
    st.one_of(
        st.sampled_from([0, 1, 999, 1_000, 1_001, 1_999, 2_000, 59_000, 60_000, 60_999, 61_000]),
        st.integers(min_value=0, max_value=70_000),
    ),
    st.integers(min_value=-150, max_value=150),
    st.integers(min_value=0, max_value=50),
)


async def _replay(url: str, policy: QuotaLimits, ops: list[tuple[str, int, int, int]]) -> None:
    clock = FakeClock()
    tenant = f"diff-{uuid.uuid4().hex[:8]}"
    redis_store = RedisQuotaStore(
        connect(url, timeout_s=2.0), key_prefix="mqdiff", timeout_s=2.0, clock=clock
    )
    memory = MemoryQuotaStore(clock=clock)
    admitted: list[tuple[Any, str]] = []
    try:
        for step, (kind, advance, amount, pick) in enumerate(ops):
            clock.advance(advance)
            if kind == "admit":
                lease = f"l{step}"
                want = await memory.admit(tenant, policy, abs(amount), lease, 2_000)
                got = await redis_store.admit(tenant, policy, abs(amount), lease, 2_000)
                assert got == want, (step, kind)
                if want.admitted:
                    admitted.append((want, lease))
            elif kind == "settle" and admitted:
                outcome, lease = admitted.pop(pick % len(admitted))
                for store in (memory, redis_store):
                    await store.settle(tenant, outcome.slot, outcome.day, amount, lease)
            elif kind == "renew" and admitted and policy.concurrent_requests is not None:
                lease = admitted[pick % len(admitted)][1]
                want_renew = await memory.renew(tenant, lease, 2_000, policy.concurrent_requests)
                got_renew = await redis_store.renew(tenant, lease, 2_000, policy.concurrent_requests)
                assert got_renew == want_renew, (step, kind)
            want_read = await memory.read(tenant)
            assert await redis_store.read(tenant) == want_read, (step, "read after", kind)
    finally:
        await redis_store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=limits, ops=st.lists(op, min_size=1, max_size=40))
def test_lua_scripts_match_python_reference(redis_server: str, policy: QuotaLimits, ops: list[Any]) -> None:
    asyncio.run(_replay(redis_server, policy, ops))


@pytest.mark.parametrize("advance", [0, 86_399_000, 86_400_000])
def test_lua_matches_reference_across_a_day_boundary(redis_server: str, advance: int) -> None:
    policy = QuotaLimits(daily_tokens=500, tokens_per_minute=400, concurrent_requests=2)
    ops = [("admit", 43_199_000, 300, 0), ("settle", advance, -100, 0), ("admit", 0, 300, 0)]
    asyncio.run(_replay(redis_server, policy, ops))

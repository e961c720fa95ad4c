"""Redis stopped or hung mid-run: fail-open and fail-closed tenants, bounded waits, recovery.

Each test runs its own redis-server (RedisServer), so stopping it disturbs no other test.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.errors import to_api_error
from gateway.quota import QuotaConfig, QuotaExceeded, QuotaUnavailable, StoreQuotaGate, build_quota_gate
from gateway.quota.interface import Admission
from protocol import RateLimitError, ServiceUnavailableError
from router.types import TenantPolicy
from tests.quota.conftest import make_policy
from tests.support.redis_server import RedisServer

TIMEOUT_MS = 100
# Generous for a loaded 2-core CI box (20 admissions at once on a busy loop took 0.54 s in one
# fresh-clone run): the point is "bounded by the timeout", not held for Redis's whole hang.
MARGIN_S = 1.0


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture
async def gate(server: RedisServer) -> AsyncIterator[StoreQuotaGate]:
    # No stretching of the timeout while the loop lags (congested_timeout_ms): these tests are
    # about a dead or hung Redis, and on a busy CI machine the stretch would blur the bound.
    config = QuotaConfig(
        redis_url=server.url,
        timeout_ms=TIMEOUT_MS,
        congested_timeout_ms=TIMEOUT_MS,
        cooldown_ms=300,
        local_share=0.5,
    )
    built = build_quota_gate(config)
    yield built
    await built.close()


async def timed_admit(gate: StoreQuotaGate, policy: TenantPolicy, request_id: str) -> tuple[float, object]:
    """(seconds taken, Admission or the client's error for what the gate raised)."""
    start = time.monotonic()
    try:
        result: object = await gate.admit(policy, request_id=request_id, estimated_tokens=10)
    except (QuotaExceeded, QuotaUnavailable) as exc:
        result = to_api_error(exc)
    return time.monotonic() - start, result


async def test_redis_down_fail_open_uses_local_share_and_fail_closed_gets_503(
    gate: StoreQuotaGate, server: RedisServer
) -> None:
    open_tenant = make_policy("open", requests_per_minute=10)
    closed_tenant = make_policy("closed", requests_per_minute=10)
    before = await gate.admit(open_tenant, request_id="before", estimated_tokens=10)
    await gate.admit(closed_tenant, request_id="before", estimated_tokens=10)
    server.stop()

    open_results = [await timed_admit(gate, open_tenant, f"o{i}") for i in range(8)]
    closed_results = [await timed_admit(gate, closed_tenant, f"c{i}") for i in range(3)]
    for took, _ in open_results + closed_results:
        assert took < TIMEOUT_MS / 1000 + MARGIN_S

    admitted = [r for _, r in open_results if isinstance(r, Admission)]
    assert len(admitted) == 5  # local_share 0.5 of 10 requests/min, on this replica alone
    assert all(a.headers["x-meridian-quota"] == "local" for a in admitted)
    assert all(isinstance(r, RateLimitError) for _, r in open_results[5:])
    for _, error in closed_results:
        assert isinstance(error, ServiceUnavailableError) and error.status_code == 503
        assert int(error.headers["retry-after"]) >= 1

    start = time.monotonic()
    await gate.settle(before, actual_tokens=3)  # dropped, not raised
    assert time.monotonic() - start < TIMEOUT_MS / 1000 + MARGIN_S
    assert gate.dropped_settlements == 1


async def test_hung_redis_never_holds_a_request_longer_than_the_timeout(
    gate: StoreQuotaGate, server: RedisServer
) -> None:
    policy = make_policy("open", requests_per_minute=100)
    await gate.admit(policy, request_id="warm", estimated_tokens=1)
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)  # accepts connections, never answers
    try:
        results = await asyncio.gather(*(timed_admit(gate, policy, f"r{i}") for i in range(20)))
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert max(took for took, _ in results) < TIMEOUT_MS / 1000 + MARGIN_S
    assert all(isinstance(r, Admission) for _, r in results)


async def test_exact_limiting_resumes_after_redis_restarts(gate: StoreQuotaGate, server: RedisServer) -> None:
    await gate.admit(make_policy(requests_per_minute=5), request_id="warm", estimated_tokens=1)
    server.stop()
    _, degraded = await timed_admit(gate, make_policy("open", requests_per_minute=5), "down")
    assert isinstance(degraded, Admission) and degraded.headers.get("x-meridian-quota") == "local"
    server.start()  # same port, empty: --save "" keeps nothing

    policy = make_policy("open", requests_per_minute=4)
    deadline = time.monotonic() + 3.0
    while True:  # back to Redis by itself within a cool-down or two
        usage = await gate.usage(policy)
        if usage["source"] == "redis":
            break
        assert time.monotonic() < deadline, "gate did not return to Redis"
        await asyncio.sleep(0.05)
    for i in range(4):
        admission = await gate.admit(policy, request_id=f"r{i}", estimated_tokens=1)
        assert "x-meridian-quota" not in admission.headers
    with pytest.raises(QuotaExceeded):
        await gate.admit(policy, request_id="r4", estimated_tokens=1)
    assert (await gate.usage(policy))["requests"]["used"] == 4

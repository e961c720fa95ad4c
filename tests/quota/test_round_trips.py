"""One Redis round trip per admission and per settlement, counted on the wire."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.quota import MemoryQuotaStore, RedisQuotaStore, StoreQuotaGate, store_breaker
from gateway.quota.redis_store import connect
from tests.quota.conftest import make_policy


class CommandLog:
    """Wraps a client's execute_command: every command redis-py sends is one round trip."""

    def __init__(self, client: Any):
        self.names: list[str] = []
        inner = client.execute_command

        async def counted(*args: Any, **options: Any) -> Any:
            self.names.append(str(args[0]).upper())
            return await inner(*args, **options)

        client.execute_command = counted


@pytest.fixture
async def counted_gate(redis_server: str) -> AsyncIterator[tuple[StoreQuotaGate, CommandLog, Any]]:
    client = connect(redis_server, timeout_s=1.0)
    log = CommandLog(client)
    gate = StoreQuotaGate(
        RedisQuotaStore(client, key_prefix="mqrt", timeout_s=1.0),
        fallback=MemoryQuotaStore(name="local"),
        breaker=store_breaker(1.0),
    )
    yield gate, log, client
    await gate.close()


async def test_admission_and_settlement_are_one_round_trip_each(counted_gate: Any) -> None:
    gate, log, _ = counted_gate
    policy = make_policy(
        requests_per_minute=100, tokens_per_minute=10_000, concurrent_requests=5, daily_tokens=10**6
    )
    await gate.admit(policy, request_id="warm", estimated_tokens=1)  # may load the scripts once
    log.names.clear()
    admission = await gate.admit(policy, request_id="a", estimated_tokens=500)
    assert log.names == ["EVALSHA"]
    await gate.renew(admission)
    assert log.names == ["EVALSHA", "EVALSHA"]
    await gate.settle(admission, actual_tokens=120)
    assert log.names == ["EVALSHA", "EVALSHA", "EVALSHA"]


async def test_script_cache_flush_costs_one_reload_and_no_error(counted_gate: Any) -> None:
    gate, log, client = counted_gate
    policy = make_policy(requests_per_minute=100)
    await gate.admit(policy, request_id="warm", estimated_tokens=1)
    await client.script_flush()
    log.names.clear()
    await gate.admit(policy, request_id="a", estimated_tokens=1)
    assert log.names == ["EVALSHA", *["SCRIPT LOAD"] * 4, "EVALSHA"]  # all four, once
    assert (await gate.usage(policy))["requests"]["used"] == 2

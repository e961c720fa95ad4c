"""Gateways SIGKILLed at random while serving lose no settled request's usage and count none twice.

Two gateway processes (Redis quota store, embedded ledger workers, a PostgreSQL ledger) in front of
a fixed-usage stub node. Rounds of concurrent requests; in each, one gateway is SIGKILLed at a
random moment and started again. Then a worker drains the streams (taking over what the killed
gateways' workers had read and not acknowledged), and:
- every request a client got a 200 for is in the ledger (settlement precedes the answer);
- the ledger holds exactly as many events as settlement scripts appended (INFO commandstats'
  XADD count: only the settlement script writes usage streams), so none is missing or doubled;
- the tokens the ledger counts as served never exceed what the node served, per tenant.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from redis.asyncio import Redis

from gateway.ledger.store.postgres import PostgresLedger
from gateway.ledger.streams import RedisStreams
from gateway.ledger.worker import LedgerWorker
from tests.quota.gateway_setup import MODEL, api_key, write_gateway_config
from tests.quota.stub_node import COMPLETION_TOKENS, PROMPT_TOKENS
from tests.support.processes import REPO_ROOT, free_port, stop_process, wait_http_ok

pytestmark = pytest.mark.slow

ROUNDS = 3
PER_ROUND = 60


class Gateway:
    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._command = [
            sys.executable,
            "-m",
            "meridian.cli",
            "gateway",
            "--config",
            str(config),
            "--port",
            str(self.port),
            "--admin-port",  # several gateways on one host: each its own admin listener
            str(free_port()),
        ]
        self._env = env
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()

    def start(self) -> None:
        self.process = subprocess.Popen(
            self._command,
            cwd=REPO_ROOT,
            env=self._env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self) -> None:
        try:
            wait_http_ok(self.url + "/health", 60, process=self.process)
        except (TimeoutError, RuntimeError) as exc:
            self._log.seek(0)
            raise RuntimeError(f"{exc}\n{self._log.read()[-3000:].decode(errors='replace')}") from None

    def sigkill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, 9)
        self.process.wait(timeout=10)


async def fire(client: httpx.AsyncClient, url: str, tenant: str) -> str | None:
    """The request id of a 200, else None (refused connection, reset, or an error)."""
    try:
        response = await client.post(
            url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {api_key(tenant)}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50},
        )
    except httpx.HTTPError:
        return None
    return response.headers["x-request-id"] if response.status_code == 200 else None


def test_gateways_killed_at_random_lose_and_double_no_settled_usage(
    redis_server: str, postgres_dsn: str, tmp_path: Path
) -> None:
    rng = random.Random(1313)
    run = uuid.uuid4().hex[:6]
    tenants = [f"crash-a-{run}", f"crash-b-{run}"]
    node_port = free_port()
    prefix = f"lk{run}"
    config = write_gateway_config(
        tmp_path,
        node_url=f"http://127.0.0.1:{node_port}",
        tenants=[{"id": t, "limits": {}} for t in tenants],
        quota={"redis_url": redis_server, "key_prefix": prefix},
    )
    data = yaml.safe_load(config.read_text())
    data["ledger"] = {
        "worker": "embedded",
        "store": {"type": "postgres", "dsn_env": "TEST_LEDGER_DSN"},
        "claim_idle_ms": 500,
        "poll_interval_ms": 50,
    }
    config.write_text(yaml.safe_dump(data))
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "MERIDIAN_NODE_TOKEN": "test-node-token",
        "TEST_LEDGER_DSN": postgres_dsn,
    }
    node = subprocess.Popen(
        [sys.executable, "-m", "tests.quota.stub_node", str(node_port), "0.1"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    gateways = [Gateway(config, env) for _ in range(2)]

    async def xadds() -> int:
        client = Redis.from_url(redis_server)
        stats = await client.info("commandstats")
        await client.aclose()
        return int(stats.get("cmdstat_xadd", {}).get("calls", 0))

    ok: set[str] = set()
    try:
        for gateway in gateways:
            gateway.start()
        for gateway in gateways:
            gateway.wait()
        xadd_before = asyncio.run(xadds())

        async def round_of_traffic(victim: Gateway) -> None:
            async with httpx.AsyncClient(timeout=20) as client:
                jobs = [
                    asyncio.create_task(fire(client, gateways[i % 2].url, tenants[i % len(tenants)]))
                    for i in range(PER_ROUND)
                ]
                await asyncio.sleep(rng.uniform(0.05, 0.6))
                victim.sigkill()
                for result in await asyncio.gather(*jobs):
                    if result is not None:
                        ok.add(result)

        for r in range(ROUNDS):
            victim = gateways[r % 2]
            asyncio.run(round_of_traffic(victim))
            victim.start()
            victim.wait()
        for gateway in gateways:
            stop_process(gateway.process)  # graceful: their last in-process work is committed
        appended = asyncio.run(xadds()) - xadd_before
        served = httpx.get(f"http://127.0.0.1:{node_port}/stats", timeout=10).json()["served"]
    finally:
        for gateway in gateways:
            if gateway.process is not None and gateway.process.poll() is None:
                gateway.sigkill()
        stop_process(node)

    async def drain_and_read() -> list:  # type: ignore[type-arg]
        client = Redis.from_url(redis_server)
        store = PostgresLedger(postgres_dsn)
        await store.start()
        source = RedisStreams(client, key_prefix=prefix, tenants=lambda: tenants, claim_idle_ms=500)
        worker = LedgerWorker(source, store, batch_size=100)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            await worker.step(wait_s=0.1)
            pending = sum(
                [(await client.xpending(source.stream_key(t), "meridian-ledger"))["pending"] for t in tenants]
            )
            lengths = sum([await client.xlen(source.stream_key(t)) for t in tenants])
            if pending == 0 and lengths == 0:
                break
        events = await store.events(0, 2**62, None, after=None, limit=10**6)
        await store.close()
        await client.aclose()
        return [e for e in events if e.tenant_id in tenants]

    events = asyncio.run(drain_and_read())
    ids = [e.request_id for e in events]
    assert len(ids) == len(set(ids))
    assert ok <= set(ids)  # every answered request is in the ledger
    assert len(events) == appended  # every settled request exactly once
    assert ok
    for tenant in tenants:
        tokens = sum(
            e.prompt_tokens + e.completion_tokens
            for e in events
            if e.tenant_id == tenant and e.status == "ok"
        )
        assert tokens <= served.get(tenant, 0) * (PROMPT_TOKENS + COMPLETION_TOKENS)
        assert tokens == (PROMPT_TOKENS + COMPLETION_TOKENS) * sum(
            1 for e in events if e.tenant_id == tenant and e.status == "ok"
        )

"""Four real gateway processes share one Redis: limits hold across them, end to end over HTTP.

A fixed-response stub node answers after a short delay; three tenants each send 200 requests at
once, spread over the four gateways. Every answer is a 200 or a well-formed 429.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.quota.gateway_setup import MODEL, api_key, write_gateway_config
from tests.quota.stub_node import COMPLETION_TOKENS, PROMPT_TOKENS
from tests.support.processes import REPO_ROOT, free_port, stop_process, wait_http_ok

GATEWAYS = 4
REQUESTS = 200  # per tenant
MAX_TOKENS = 100


@contextmanager
def started(commands: list[list[str]], ready_urls: list[str]) -> Iterator[None]:
    """Start every process at once (start-up overlaps), then wait for each to answer."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MERIDIAN_NODE_TOKEN": "test-node-token"}
    with ExitStack() as stack:
        logs = []
        for command in commands:
            log = stack.enter_context(tempfile.TemporaryFile())
            process = subprocess.Popen(
                command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            stack.callback(stop_process, process)
            logs.append((process, log))
        for (process, log), url in zip(logs, ready_urls, strict=True):
            try:
                wait_http_ok(url, 60, process=process)
            except (TimeoutError, RuntimeError) as exc:
                log.seek(0)
                raise RuntimeError(f"{exc}\n{log.read()[-3000:].decode(errors='replace')}") from None
        yield


async def fire(client: httpx.AsyncClient, gateway: str, tenant: str) -> httpx.Response:
    return await client.post(
        f"{gateway}/v1/chat/completions",
        headers={"authorization": f"Bearer {api_key(tenant)}"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": MAX_TOKENS},
    )


@pytest.mark.slow
async def test_four_gateways_enforce_one_tenants_limits_exactly(redis_server: str, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    tenants = {
        "tokens": {"id": f"tok-{run}", "limits": {"tokens_per_minute": 1000}},
        "requests": {"id": f"req-{run}", "limits": {"requests_per_minute": 15}},
        "concurrency": {"id": f"con-{run}", "limits": {"concurrent_requests": 5}},
    }
    node_port = free_port()
    node_url = f"http://127.0.0.1:{node_port}"
    quota = {"redis_url": redis_server, "key_prefix": f"mqgw{run}"}  # default timeouts
    config = write_gateway_config(tmp_path, node_url=node_url, tenants=list(tenants.values()), quota=quota)
    ports = [free_port() for _ in range(GATEWAYS)]
    gateways = [f"http://127.0.0.1:{p}" for p in ports]
    commands = [[sys.executable, "-m", "tests.quota.stub_node", str(node_port), "0.15"]] + [
        [sys.executable, "-m", "meridian.cli", "gateway", "--config", str(config), "--port", str(p)]
        for p in ports
    ]
    with started(commands, [f"{node_url}/ready"] + [f"{g}/health" for g in gateways]):
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            await asyncio.sleep(1.0)  # every gateway has probed the node ready
            jobs = [
                fire(client, gateways[i % GATEWAYS], t["id"])
                for t in tenants.values()
                for i in range(REQUESTS)
            ]
            started_at = time.monotonic()
            responses = await asyncio.gather(*jobs)
            took = time.monotonic() - started_at
            stats = (await client.get(f"{node_url}/stats")).json()
            usage = (
                await client.get(
                    f"{gateways[1]}/v1/quota",
                    headers={"authorization": f"Bearer {api_key(tenants['tokens']['id'])}"},
                )
            ).json()

    by_tenant: dict[str, list[httpx.Response]] = {name: [] for name in tenants}
    for index, response in enumerate(responses):
        by_tenant[list(tenants)[index // REQUESTS]].append(response)
    assert took < 30
    for name, answers in by_tenant.items():
        assert {r.status_code for r in answers} <= {200, 429}, name
        for r in answers:
            if r.status_code == 429:
                check_429(r)
    for r in by_tenant["tokens"]:
        assert r.headers["x-ratelimit-limit-tokens"] == "1000" and "x-ratelimit-reset-tokens" in r.headers
    for r in by_tenant["requests"]:
        assert (
            r.headers["x-ratelimit-limit-requests"] == "15" and "x-ratelimit-remaining-requests" in r.headers
        )
    ok = {name: [r for r in answers if r.status_code == 200] for name, answers in by_tenant.items()}
    # Redis stayed up, so however loaded the gateways were, nothing was admitted on local shares.
    assert not [r for r in responses if r.headers.get("x-meridian-quota") == "local"]

    # All 200 arrive within seconds, so one 60 s window covers them all.
    per_request = PROMPT_TOKENS + COMPLETION_TOKENS
    assert 0 < len(ok["tokens"]) * per_request <= 1000
    assert usage["tokens"]["used"] == len(ok["tokens"]) * per_request  # refunds reached Redis
    assert len(ok["requests"]) == 15
    assert stats["max_in_flight"][tenants["concurrency"]["id"]] <= 5
    assert len(ok["concurrency"]) >= 5


def check_429(response: httpx.Response) -> None:
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    assert int(response.headers["retry-after"]) >= 1

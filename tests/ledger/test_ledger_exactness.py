"""The ledger adds up to exactly what clients were told: N mixed requests through a real gateway,
two real nodes and an Anthropic stand-in (split usage: input and cache reads in message_start,
output in message_delta) — streamed and not, failed, and a stream continued after its node was
SIGKILLed — and the ledger's totals per tenant and model equal the sums of the usage the clients
received, to the token, and its costs equal tokens times prices, to the cent.

Two set-ups: the embedded defaults (in-process quota store, SQLite ledger, `make up`) and the
production one (Redis quota store and usage streams, PostgreSQL ledger).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.policy import key_digest
from gateway.policy.keys import hash_api_key
from router.types import TenantPolicy
from tests.gateway.conftest import (
    NodeProcess,
    gateway_config,
    run_gateway,
    running_fleet,
    start_nodes,
    write_regions,
)
from tests.support.fake_providers import FakeProvider, Fault, running

pytestmark = pytest.mark.slow

SMALL, CLAUDE = "meridian-small", "claude-tiny"
PRICES = {  # USD per million tokens; large, so that cents are many tokens apart
    SMALL: {"input": 1000.0, "cached_input": 100.0, "output": 3000.0},
    CLAUDE: {"input": 2000.0, "cached_input": 200.0, "output": 8000.0},
}
OPERATOR_KEY = "sk-ledger-operator"
KEYS = {"acme": "sk-acme-ledger", "globex": "sk-globex-ledger"}
TENANTS = tuple(
    TenantPolicy(tenant_id=t, api_key_hashes=frozenset({key_digest(k)}), allow_commercial=True)
    for t, k in KEYS.items()
)
TIMEOUT = httpx.Timeout(60.0)


@pytest.fixture(scope="module")
def fleet(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    logs = tmp_path_factory.mktemp("ledger-exactness")
    placements = [("node-1", "eu-west", "eu"), ("node-2", "eu-west", "eu")]
    with running_fleet(placements, {SMALL: (llama_checkpoint, "small")}, logs) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def anthropic() -> Iterator[FakeProvider]:
    with running(FakeProvider("anthropic", api_key="sk-ant-ledger")) as provider:
        yield provider


class Received:
    """What the clients were told, per (tenant, model): tokens and requests."""

    def __init__(self) -> None:
        self.tokens: Counter[tuple[str, str, str]] = Counter()
        self.requests: Counter[tuple[str, str]] = Counter()

    def add(self, tenant: str, model: str, usage: dict[str, Any] | None) -> None:
        self.requests[(tenant, model)] += 1
        usage = usage or {}
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        self.tokens[(tenant, model, "input")] += int(usage.get("prompt_tokens") or 0)
        self.tokens[(tenant, model, "cached")] += cached
        self.tokens[(tenant, model, "output")] += int(usage.get("completion_tokens") or 0)

    def cost(self, tenant: str, model: str) -> float:
        price = PRICES[model]
        cached = self.tokens[(tenant, model, "cached")]
        uncached = self.tokens[(tenant, model, "input")] - cached
        return (
            uncached * price["input"]
            + cached * price["cached_input"]
            + self.tokens[(tenant, model, "output")] * price["output"]
        ) / 1e6


def body(model: str, *, stream: bool, max_tokens: int = 12, text: str = "count the stars") -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        out |= {"stream": True, "stream_options": {"include_usage": True}}
    return out


async def read_stream(response: httpx.Response) -> dict[str, Any] | None:
    usage = None
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
    return usage


async def one(
    client: httpx.AsyncClient, url: str, tenant: str, request: dict[str, Any], got: Received
) -> None:
    headers = {"authorization": f"Bearer {KEYS[tenant]}"}
    if request.get("stream"):
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=request, headers=headers
        ) as response:
            assert response.status_code == 200, await response.aread()
            got.add(tenant, request["model"], await read_stream(response))
        return
    response = await client.post(url + "/v1/chat/completions", json=request, headers=headers)
    assert response.status_code == 200, response.text
    got.add(tenant, response.json()["model"], response.json()["usage"])


async def continued_streams(url: str, fleet: list[NodeProcess], got: Received) -> None:
    """Three long streams; the node serving the first is killed as soon as that stream's first
    chunk is in, so it is continued on the other node. (Killing it only once all three had their
    first chunk let a fast node finish the first stream before the kill: nothing to continue.)"""
    headers = {"authorization": f"Bearer {KEYS['acme']}"}
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        requests = [body(SMALL, stream=True, max_tokens=400, text=f"tell a long story {i}") for i in range(3)]
        opened, lines = [], []
        for i, r in enumerate(requests):
            response = await client.send(
                client.build_request("POST", url + "/v1/chat/completions", json=r, headers=headers),
                stream=True,
            )
            opened.append(response)
            lines.append(response.aiter_lines())
            assert (await anext(lines[-1])).startswith("data: ")
            if i == 0:
                victim = response.headers["x-meridian-node"]
                next(n for n in fleet if n.node_id == victim).kill()
        for response, it in zip(opened, lines, strict=True):
            usage = None
            async for line in it:
                if line.startswith("data: ") and line != "data: [DONE]":
                    usage = json.loads(line[6:]).get("usage") or usage
            await response.aclose()
            got.add("acme", SMALL, usage)


async def ledger_rows(url: str, path: str, since: int, group_by: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        response = await client.get(
            url + path,
            params={"start_time": since, "bucket_width": "1d", "group_by": group_by},
            headers={"authorization": f"Bearer {OPERATOR_KEY}"},
        )
    assert response.status_code == 200, response.text
    return [r for bucket in response.json()["data"] for r in bucket["results"]]


async def wait_for_ledger(url: str, since: int, expected: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        rows = await ledger_rows(url, "/v1/usage", since, "tenant_id")
        if sum(r["num_model_requests"] for r in rows) >= expected or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("backend", ["embedded", "redis-postgres"])
def test_ledger_totals_equal_what_clients_received(
    backend: str,
    fleet: list[NodeProcess],
    anthropic: FakeProvider,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    start_nodes(fleet)  # a previous case killed one
    regions = write_regions(tmp_path / "regions.yaml", fleet)
    entry = {
        "id": "anthropic-test",
        "kind": "anthropic",
        "base_url": anthropic.base_url,
        "api_key_env": "TEST_ANTHROPIC_KEY",
        "region": "eu-west",
        "jurisdiction": "eu",
        "serve_as": "model",
        "models": {CLAUDE: "claude-test-1"},
        "timeouts": {"connect_s": 2.0, "first_byte_s": 10.0, "idle_s": 10.0},
        "breaker": {"min_calls": 1000},
    }
    env = {"TEST_ANTHROPIC_KEY": anthropic.api_key}
    ledger: dict[str, Any] = {"operator_keys": [hash_api_key(OPERATOR_KEY)], "poll_interval_ms": 50}
    quota: dict[str, Any] = {}
    if backend == "embedded":
        ledger["store"] = {"type": "sqlite", "path": str(tmp_path / "ledger.sqlite")}
    else:
        quota = {
            "redis_url": request.getfixturevalue("redis_server"),
            "key_prefix": f"lx{uuid.uuid4().hex[:6]}",
        }
        ledger["store"] = {"type": "postgres", "dsn_env": "TEST_LEDGER_DSN"}
        env["TEST_LEDGER_DSN"] = request.getfixturevalue("postgres_dsn")
    catalog = [
        {"name": SMALL, "tier": "small", "price": PRICES[SMALL]},
        # The provider model's own price wins over the logical model's.
        {
            "name": CLAUDE,
            "tier": "large",
            "price": {"input": 1, "output": 1},
            "provider_prices": {"claude-test-1": PRICES[CLAUDE]},
        },
    ]
    config = gateway_config(
        regions,
        catalog=catalog,
        providers={"endpoints": [entry]},
        quota=quota,
        ledger=ledger,
        admission={"enabled": False},
        price_table_version="test-prices-1",
    )
    got = Received()
    since = int(time.time()) - 5
    with run_gateway(config, tenants=TENANTS, env=env) as gw:

        async def traffic() -> int:
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                anthropic.always(Fault(status=500))
                for tenant in KEYS:  # failed on every target: a 5xx, no usage, still a request
                    response = await client.post(
                        gw.url + "/v1/chat/completions",
                        json=body(CLAUDE, stream=False),
                        headers={"authorization": f"Bearer {KEYS[tenant]}"},
                    )
                    assert response.status_code >= 500
                    got.add(tenant, CLAUDE, None)
                anthropic.always(None)
                jobs = [
                    one(
                        client, gw.url, tenant, body(model, stream=stream, text=f"{tenant} {i} {stream}"), got
                    )
                    for tenant in KEYS
                    for model in (SMALL, CLAUDE)
                    for stream in (False, True)
                    for i in range(3)
                ]
                await asyncio.gather(*jobs)
            await continued_streams(gw.url, fleet, got)
            return sum(got.requests.values())

        sent = asyncio.run(traffic())
        asyncio.run(wait_for_ledger(gw.url, since, sent))
        usage = asyncio.run(ledger_rows(gw.url, "/v1/usage", since, "tenant_id,model"))
        costs = asyncio.run(ledger_rows(gw.url, "/v1/costs", since, "tenant_id,model"))
        continued = gw.metric("meridian_gateway_failovers_total", kind="continuation")
        metric = {
            (t, m): gw.metric("meridian_gateway_cost_usd_total", tenant=t, model=m)
            for t in KEYS
            for m in (SMALL, CLAUDE)
        }

    ledger_tokens: Counter[tuple[str, str, str]] = Counter()
    ledger_requests: Counter[tuple[str, str]] = Counter()
    for row in usage:
        key = (row["tenant_id"], row["model"])
        ledger_requests[key] += row["num_model_requests"]
        ledger_tokens[(*key, "input")] += row["input_tokens"]
        ledger_tokens[(*key, "cached")] += row["input_cached_tokens"]
        ledger_tokens[(*key, "output")] += row["output_tokens"]
    assert continued >= 1  # the killed node's stream went on elsewhere
    assert ledger_requests == got.requests
    assert ledger_tokens == +got.tokens
    assert got.tokens[("acme", CLAUDE, "cached")] > 0  # the stand-in's cache reads were counted
    ledger_costs = {(r["tenant_id"], r["model"]): r["amount"]["value"] for r in costs}
    for key in got.requests:
        assert round(ledger_costs.get(key, 0.0), 2) == round(got.cost(*key), 2), key
        assert round(metric[key], 2) == round(got.cost(*key), 2), key

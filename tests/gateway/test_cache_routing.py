"""Cache-aware routing end to end (issue 35): three real nodes behind a gateway; a tenant's
requests follow the node that holds its system prompt, and the route header says what was cached."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from protocol.prefix_cache import prefix_names
from tests.gateway.conftest import GLOBAL_KEY, NodeProcess, RunningGateway, gateway_over, running_fleet

pytestmark = pytest.mark.slow

MODEL = "meridian-small"
HEADERS = {"authorization": f"Bearer {GLOBAL_KEY}"}


@pytest.fixture(scope="module")
def gateway(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    logs = tmp_path_factory.mktemp("cache-routing")
    placements = [(f"n{i}", "eu-west", "eu") for i in range(3)]
    fleet: list[NodeProcess]
    with running_fleet(placements, {MODEL: (llama_checkpoint, "small")}, logs) as fleet, gateway_over(
        fleet, logs
    ) as running:
        yield running


def _ask(client: httpx.Client, url: str, system: str, user: str) -> tuple[str, str]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 1,
    }
    response = client.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    return response.headers["x-meridian-node"], response.headers["x-meridian-route"]


def _wait_published(gw: RunningGateway, system: str, node_id: str) -> None:
    """Until the gateway's mirror of `node_id`'s table holds the system prompt."""
    name = prefix_names(MODEL, None, [("system", system)])[0]
    deadline = time.monotonic() + 20
    while True:
        nodes = {n.node_id: n for n in gw.gateway.fleet.snapshot().nodes}
        load = nodes[node_id].load
        if load is not None and name in load.cached_prefixes:
            return
        assert time.monotonic() < deadline, "the gateway never saw the node publish the prompt"
        time.sleep(0.05)


def test_each_tenants_requests_follow_the_node_holding_its_system_prompt(gateway: RunningGateway) -> None:
    with httpx.Client() as client:
        for tenant in range(6):
            system = f"Tenant {tenant} runs a shop of rare maps and old globes. " * 12
            first, _ = _ask(client, gateway.url, system, "hello")
            _wait_published(gateway, system, first)

            later = [_ask(client, gateway.url, system, f"question {i}") for i in range(3)]

            assert {node for node, _ in later} == {first}
            for _, route in later:
                cached = int(route.split("cached=")[1].split(";")[0])
                assert cached > 0, route

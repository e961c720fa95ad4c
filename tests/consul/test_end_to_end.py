"""A real node process in the Consul stand-in, and a gateway that finds it there and routes to it."""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.consul.conftest import REAP
from tests.consul.timing import eventually
from tests.consul_api import ConsulStandIn
from tests.support.processes import RunningProcess, free_port, python_command, start_process, stop_process

NODE_TOKEN = "node-secret"
TENANT_KEY = "sk-consul-e2e"
TTL_S = 2.0

pytestmark = pytest.mark.slow


@pytest.fixture
def consul() -> Iterator[ConsulStandIn]:
    with ConsulStandIn(("eu-west",), **REAP) as stand_in:
        yield stand_in


@pytest.fixture
def node(consul: ConsulStandIn, llama_checkpoint: Path, tmp_path: Path) -> Iterator[RunningProcess]:
    """`python -m regional_node node` with a `consul:` section, started and ready."""
    port = free_port()
    config = {
        "node_id": "eu-node-1",
        "region": "eu-west",
        "jurisdiction": "eu",
        "host": "127.0.0.1",
        "port": port,
        "models": [{"name": "meridian-small", "path": str(llama_checkpoint), "tier": "small"}],
        "consul": {"address": consul.address(), "ttl_s": TTL_S, "deregister_critical_after_s": 60},
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with start_process(
        python_command("-m", "regional_node", "node", "--config", str(path)),
        env={"MERIDIAN_NODE_TOKEN": NODE_TOKEN},
        ready_url=f"http://127.0.0.1:{port}/ready",
        ready_headers={"Authorization": f"Bearer {NODE_TOKEN}"},
    ) as running:
        yield running


def check_id(consul: ConsulStandIn) -> str:
    [service_id] = consul.service_ids()
    return f"service:{service_id}"


async def test_a_node_process_registers_passes_expires_when_hung_and_deregisters_on_stop(
    consul: ConsulStandIn, node: RunningProcess
) -> None:
    await eventually(lambda: len(consul.service_ids()) == 1, within=5)
    check = check_id(consul)
    await eventually(lambda: consul.check_status(check) == "passing", within=5)
    os.kill(node.process.pid, signal.SIGSTOP)  # hung: no more heartbeats
    try:
        await eventually(lambda: consul.check_status(check) == "critical", within=TTL_S + 2)
    finally:
        os.kill(node.process.pid, signal.SIGCONT)
    await eventually(lambda: consul.check_status(check) == "passing", within=5)
    stop_process(node.process)  # SIGTERM: uvicorn's graceful shutdown runs the app's shutdown hook
    assert consul.service_ids() == set(), "a clean shutdown deregisters"
    assert "deregistered" in node.log()


async def test_the_gateway_routes_to_a_node_it_found_in_consul_and_stops_when_its_ttl_fails(
    consul: ConsulStandIn, node: RunningProcess, tmp_path: Path
) -> None:
    from litestar.testing import AsyncTestClient

    from gateway.app import build_gateway, create_app
    from gateway.config import config_from_dict

    policies = tmp_path / "policies"
    policies.mkdir()
    tenant = {
        "id": "acme-eu",
        "api_keys": ["sha256:" + hashlib.sha256(TENANT_KEY.encode()).hexdigest()],
        "residency": {"jurisdictions": ["eu"]},
    }
    (policies / "tenants.yaml").write_text(yaml.safe_dump({"tenants": [tenant]}), encoding="utf-8")
    config = config_from_dict(
        {
            "home_region": "eu-west",
            "catalog": [{"name": "meridian-small", "tier": "small"}],
            "policies": str(policies),
            "directory": {"type": "consul", "address": consul.address(), "datacenters": ["eu-west"]},
            "timeouts": {"probe_interval_s": 0.2},
        },
        base_dir=tmp_path,  # its ledger's default `.meridian/` goes here, not in the repo
    )
    parts = build_gateway(config, env={"MERIDIAN_NODE_TOKEN": NODE_TOKEN})
    app = create_app(config, gateway=parts)
    directory = parts.directory
    body = {"model": "meridian-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {TENANT_KEY}"}
    async with AsyncTestClient(app) as gateway:
        await eventually(lambda: [n.node_id for n in directory.snapshot()] == ["eu-node-1"], within=5)
        await eventually(lambda: parts.fleet.snapshot().nodes[0].healthy, within=5)
        response = await gateway.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["x-meridian-node"] == "eu-node-1"
        os.kill(node.process.pid, signal.SIGSTOP)
        try:
            await eventually(lambda: directory.snapshot() == (), within=TTL_S + 2)
            response = await gateway.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 503, response.text
        finally:
            os.kill(node.process.pid, signal.SIGCONT)

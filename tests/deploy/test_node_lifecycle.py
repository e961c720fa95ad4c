"""deploy/k8s/base/node/lifecycle.py, the node pod's readiness probe and preStop drain, run as
Kubernetes runs them (a separate process) against a real node."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import yaml

from tests.deploy.conftest import CONSUL_TOKEN, DEPLOY, NODE_TOKEN, ConsulRecorder, StartedNode
from tests.support.processes import free_port, python_command

LIFECYCLE = DEPLOY / "k8s" / "base" / "node" / "lifecycle.py"


def lifecycle(*args: str, node: StartedNode, token: str = NODE_TOKEN) -> subprocess.CompletedProcess[str]:
    env = {"MERIDIAN_NODE_URL": node.url, "MERIDIAN_NODE_TOKEN": token, "CONSUL_HTTP_TOKEN": CONSUL_TOKEN}
    return subprocess.run(
        python_command(str(LIFECYCLE), *args),
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_ready_probe_passes_on_a_ready_node(started_node: StartedNode) -> None:
    assert lifecycle("ready", node=started_node).returncode == 0


def test_ready_probe_fails_without_the_node_credential(started_node: StartedNode) -> None:
    result = lifecycle("ready", node=started_node, token="wrong")
    assert result.returncode == 1
    assert "401" in result.stderr


def test_drain_puts_the_service_the_node_registered_into_maintenance(
    started_node: StartedNode, consul_recorder: ConsulRecorder
) -> None:
    (service_id,) = set(consul_recorder.registered_ids())
    args = ["drain", "--config", str(started_node.config_path), "--node-id", started_node.node_id]
    result = lifecycle(*args, "--host", "127.0.0.1", "--settle-s", "0", node=started_node)
    assert result.returncode == 0, result.stderr
    assert "drained" in result.stderr  # an idle node: nothing running or waiting
    ((path, headers),) = consul_recorder.puts("/v1/agent/service/maintenance/")
    url = urlsplit(path)
    assert url.path == f"/v1/agent/service/maintenance/{quote(service_id, safe='')}"
    assert parse_qs(url.query)["enable"] == ["true"]
    assert headers["X-Consul-Token"] == CONSUL_TOKEN


def test_drain_still_waits_for_the_node_when_consul_is_unreachable(
    started_node: StartedNode, tmp_path: Path
) -> None:
    config = yaml.safe_load(started_node.config_path.read_text(encoding="utf-8"))
    config["consul"]["address"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = lifecycle(
        "drain", "--config", str(path), "--node-id", "n", "--host", "h", "--settle-s", "0", node=started_node
    )
    assert result.returncode == 0
    assert "could not enter maintenance" in result.stderr
    assert "drained" in result.stderr

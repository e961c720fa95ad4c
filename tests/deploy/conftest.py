"""Fixtures for the deploy kit's tests: the overlays rendered by `kubectl kustomize`, and one real
node process (with a recording Consul agent beside it) for the metric contract and the node pod's
lifecycle script.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.processes import REPO_ROOT, free_port, python_command, start_process

DEPLOY = REPO_ROOT / "deploy"
OVERLAYS = DEPLOY / "k8s" / "overlays"
REGIONS = tuple(sorted(path.name for path in OVERLAYS.iterdir() if (path / "kustomization.yaml").exists()))
NODE_TOKEN = "deploy-test-node-token"
CONSUL_TOKEN = "deploy-test-consul-token"


def render(kustomization: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <dir>` as a list of objects."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the Kubernetes overlays cannot be rendered")
    result = subprocess.run(
        [kubectl, "kustomize", str(kustomization)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {kustomization} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="package")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Every overlay, rendered once for the package: region -> objects."""
    return {region: render(OVERLAYS / region) for region in REGIONS}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of `kind` whose name is `name`, or `name` plus kustomize's hash suffix."""
    for obj in objects:
        actual = obj["metadata"]["name"]
        if obj["kind"] == kind and (actual == name or actual.rsplit("-", 1)[0] == name):
            return obj
    raise AssertionError(f"no {kind} {name} among {[(o['kind'], o['metadata']['name']) for o in objects]}")


@dataclass
class ConsulRecorder:
    """A Consul agent that accepts every write and records it, standing in for the agent a node
    registers with. (tests/consul_api's stand-in has no maintenance endpoint.)"""

    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.server_address[1]}"

    def registered_ids(self) -> list[str]:
        return [
            json.loads(body)["ID"]
            for method, path, _, body in self.requests
            if path == "/v1/agent/service/register"
        ]

    def puts(self, prefix: str) -> list[tuple[str, dict[str, str]]]:
        return [(path, headers) for method, path, headers, _ in self.requests if path.startswith(prefix)]


@pytest.fixture(scope="package")
def consul_recorder() -> Iterator[ConsulRecorder]:
    recorder = ConsulRecorder()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            recorder.requests.append(("PUT", self.path, dict(self.headers.items()), body))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    recorder.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=recorder.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.server.shutdown()
        recorder.server.server_close()
        thread.join(timeout=5)


@dataclass
class StartedNode:
    url: str
    node_id: str
    config_path: Path


@pytest.fixture(scope="package")
def started_node(
    qwen2_checkpoint: Path, consul_recorder: ConsulRecorder, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartedNode]:
    """A real node serving one tiny model, registered with the recording Consul agent."""
    port = free_port()
    config_path = tmp_path_factory.mktemp("deploy-node") / "node.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "region": "eu-west",
                "jurisdiction": "eu",
                "port": port,
                "models": [{"name": "tiny", "path": str(qwen2_checkpoint), "tier": "small"}],
                "consul": {"address": consul_recorder.address, "token_env": "CONSUL_HTTP_TOKEN"},
            }
        ),
        encoding="utf-8",
    )
    node_id = "meridian-node-7d9c5b-x2x4q"  # what a pod name looks like
    cmd = python_command("-m", "meridian.cli", "node", "--config", str(config_path))
    cmd += ["--node-id", node_id, "--host", "127.0.0.1"]
    env = {"MERIDIAN_NODE_TOKEN": NODE_TOKEN, "CONSUL_HTTP_TOKEN": CONSUL_TOKEN}
    url = f"http://127.0.0.1:{port}"
    with start_process(
        cmd, env=env, ready_url=f"{url}/ready", ready_headers={"authorization": f"Bearer {NODE_TOKEN}"}
    ):
        yield StartedNode(url=url, node_id=node_id, config_path=config_path)


def documented_names(listing: str) -> set[str]:
    """The names in a tests/deploy/schemas/*.txt list (one per line, # comments)."""
    text = (Path(__file__).parent / "schemas" / listing).read_text(encoding="utf-8")
    return {line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}


def dcgm_collected() -> set[str]:
    """dcgm-exporter's fields the GPU kit's counters.csv collects (each series is named after one)."""
    csv = (DEPLOY / "k8s" / "gpu-monitoring" / "counters.csv").read_text(encoding="utf-8")
    return {
        line.split(",", 1)[0].strip()
        for line in csv.splitlines()
        if line.strip() and not line.startswith("#")
    }

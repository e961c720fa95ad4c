"""Real processes for gateway tests: regional nodes (subprocesses) and a gateway served by uvicorn
in a background thread of the test process, so tests can read its metrics and fleet state.

Fleets are module-scoped: starting a node costs seconds, so each test module shares its nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.app import Gateway, build_gateway, create_app
from gateway.config import config_from_dict, load_config
from gateway.runtime.serve import admin_config, bind, run_with_loop, serve_with_admin, uvicorn_config
from router.types import Residency, TenantLimits, TenantPolicy
from tests.support.processes import REPO_ROOT, free_port, python_command, stop_process, wait_http_ok

NODE_TOKEN = "test-node-token"
AUTH = {"authorization": f"Bearer {NODE_TOKEN}"}
GLOBAL_KEY = "sk-test-global"
EU_KEY = "sk-test-eu"
SMALL_KEY = "sk-test-small"


def _hash(key: str) -> frozenset[str]:
    from gateway.policy import key_digest

    return frozenset({key_digest(key)})


TEST_TENANTS = (
    TenantPolicy(tenant_id="t-global", api_key_hashes=_hash(GLOBAL_KEY)),
    TenantPolicy(
        tenant_id="t-eu", api_key_hashes=_hash(EU_KEY), residency=Residency(jurisdictions=frozenset({"eu"}))
    ),
    TenantPolicy(
        tenant_id="t-small",
        api_key_hashes=_hash(SMALL_KEY),
        models=frozenset({"meridian-small"}),
        limits=TenantLimits(max_tokens=32, context_tokens=256),
    ),
)


class NodeProcess:
    """One regional node process that a test may kill (SIGKILL), freeze, and start again.
    Subclasses may add environment variables (`extra_env`) or flags (`command`)."""

    extra_env: Mapping[str, str] = {}

    def __init__(
        self, node_id: str, region: str, jurisdiction: str, models: dict[str, tuple[Path, str]], log_dir: Path
    ) -> None:
        self.node_id = node_id
        self.region = region
        self.jurisdiction = jurisdiction
        self.models = models
        self.port = free_port()
        self.log_path = log_dir / f"{node_id}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = python_command("-m", "meridian.cli", "node", "--host", "127.0.0.1", "--port", str(self.port))
        cmd += ["--node-id", self.node_id, "--region", self.region, "--jurisdiction", self.jurisdiction]
        for name, (path, tier) in self.models.items():
            cmd += ["--model", f"{name}={path}:{tier}"]
        return cmd

    def launch(self) -> None:
        env = {
            **os.environ,
            "MERIDIAN_NODE_TOKEN": NODE_TOKEN,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 90.0) -> None:
        try:
            wait_http_ok(self.url + "/ready", timeout, headers=AUTH, process=self.process)
        except (TimeoutError, RuntimeError) as exc:
            raise RuntimeError(
                f"{exc}\n--- {self.node_id} log ---\n{self.log_path.read_text()[-3000:]}"
            ) from None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crashed machine would look to the gateway."""
        if self.alive():
            assert self.process is not None
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def freeze(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", headers=AUTH, timeout=5).text


def start_nodes(nodes: Sequence[NodeProcess]) -> None:
    """Launch all first, then wait: the nodes start up in parallel."""
    for node in nodes:
        if not node.alive():
            node.launch()
    for node in nodes:
        node.wait_ready()


@contextmanager
def running_fleet(
    placements: Sequence[tuple[str, str, str]],
    models: dict[str, tuple[Path, str]],
    logs: Path,
    node_type: type[NodeProcess] = NodeProcess,
) -> Iterator[list[NodeProcess]]:
    """One node per (node_id, region, jurisdiction), each serving every model; all stopped on exit.
    `node_type` may be a NodeProcess subclass that adds flags to the node's command."""
    fleet = [
        node_type(node_id, region, jurisdiction, models, logs) for node_id, region, jurisdiction in placements
    ]
    try:
        start_nodes(fleet)
        yield fleet
    finally:
        for node in fleet:
            node.stop()


def write_regions(path: Path, nodes: Sequence[NodeProcess]) -> Path:
    entries = [
        {
            "node_id": n.node_id,
            "url": n.url,
            "region": n.region,
            "jurisdiction": n.jurisdiction,
            "models": list(n.models),
        }
        for n in nodes
    ]
    path.write_text(yaml.safe_dump({"nodes": entries}), encoding="utf-8")
    return path


def gateway_config(regions_file: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "home_region": "eu-west",
        "policies": str(REPO_ROOT / "policies"),
        "catalog": [{"name": "meridian-small", "tier": "small"}, {"name": "meridian-large", "tier": "large"}],
        "directory": {"type": "static", "file": str(regions_file)},
        "timeouts": {"probe_interval_s": 0.5, "probe_s": 0.5, "stream_idle_s": 20.0, "read_s": 60.0},
        "retry": {"max_attempts": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.05},
        "ejection": {"base_s": 0.5, "max_s": 5.0},
    }
    config.update(overrides)
    return config


@dataclass
class RunningGateway:
    url: str
    gateway: Gateway
    admin_url: str  # the admin listener: /metrics

    def metric(self, name: str, **labels: str) -> float:
        value = self.gateway.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    def wait_healthy(self, nodes: Sequence[NodeProcess], timeout: float = 20.0) -> None:
        """Start any of `nodes` that is down, then wait until this gateway has seen all healthy."""
        start_nodes(nodes)
        deadline = time.monotonic() + timeout
        while httpx.get(self.url + "/health").json()["healthy_nodes"] < len(nodes):
            assert time.monotonic() < deadline, "the gateway did not see every node healthy"
            time.sleep(0.1)


@dataclass
class BrokenStream:
    """A stream whose serving node was frozen, then killed, while it was still answering."""

    serving: NodeProcess
    headers: httpx.Headers
    lines: list[str]  # every line the client read, to the stream's end


def _carries_output(line: str) -> bool:
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or []
    return any(c.get("token_ids") or c.get("text") or (c.get("delta") or {}).get("content") for c in choices)


def break_stream_midway(
    gw: RunningGateway, nodes: Sequence[NodeProcess], body: dict[str, Any], *, after: int = 20, tries: int = 5
) -> BrokenStream:
    """Stream `body` as GLOBAL_KEY; once `after` chunks carrying output have arrived, freeze the node
    serving it (so it cannot finish the answer before it dies) and kill it; read on to the end.

    A toy node makes a token in well under a millisecond, so a client held back for a moment (a busy
    2-core machine) can find its node has already sent the whole answer, and the kill breaks
    nothing. The gateway counts every stream that broke on a target (`upstream_attempts_total`,
    outcome="broken"); where this try added none, the nodes are brought back and it is tried again.
    """
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    for _ in range(tries):
        gw.wait_healthy(nodes)
        with httpx.stream(
            "POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=60.0
        ) as response:
            assert response.status_code == 200, response.read()
            serving = next(n for n in nodes if n.node_id == response.headers["x-meridian-node"])
            labels = {"target": serving.node_id, "region": serving.region, "outcome": "broken"}
            broken_before = gw.metric("meridian_gateway_upstream_attempts_total", **labels)
            lines, seen = [], 0
            for line in response.iter_lines():
                lines.append(line)
                seen += _carries_output(line)
                if serving.alive() and seen >= after:
                    serving.freeze()
                    serving.kill()
        if gw.metric("meridian_gateway_upstream_attempts_total", **labels) > broken_before:
            return BrokenStream(serving, response.headers, lines)
    raise AssertionError(f"in {tries} tries, the node always finished its answer before it was killed")


@contextmanager
def run_gateway(
    config: dict[str, Any],
    tenants: Sequence[TenantPolicy] = TEST_TENANTS,
    env: Mapping[str, str] | None = None,
    path: Path | None = None,
) -> Iterator[RunningGateway]:
    """A gateway on a free port, served from a background thread with its own event loop.
    `env` adds environment variables the gateway reads (e.g. providers' API keys). With `path`,
    the config is written there as YAML and loaded from the file (what reloads re-read)."""
    import uvicorn

    # Relative paths (the ledger's and the batch files' defaults, `.meridian/...`) resolve against
    # a folder of this gateway's own, not the working directory: there every test gateway, on
    # every xdist worker, shared one ledger and one batch queue with each other and with the
    # developer's `make up` state (a batch fuzzed in one test had its callbacks retried in others).
    state = Path(tempfile.mkdtemp(prefix="meridian-test-gw-"))
    if path is not None:
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        parsed = load_config(path)
    else:
        parsed = config_from_dict(config, source="test-gateway.yaml", base_dir=state)
    gateway = build_gateway(
        parsed, extra_policies=tenants, env={"MERIDIAN_NODE_TOKEN": NODE_TOKEN, **(env or {})}
    )
    app = create_app(parsed, gateway=gateway)
    port = free_port()
    config = uvicorn_config(app, "127.0.0.1", port)
    server = uvicorn.Server(config)
    admin_sock = bind("127.0.0.1", 0)  # the admin listener (/metrics), on a free port
    admin = uvicorn.Server(admin_config(app, admin_sock))
    thread = threading.Thread(
        target=run_with_loop,
        args=(config, serve_with_admin(server, admin, admin_sock)),
        name="test-gateway",
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the gateway thread died during start-up"
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)
    try:
        yield RunningGateway(
            url=f"http://127.0.0.1:{port}",
            gateway=gateway,
            admin_url=f"http://127.0.0.1:{admin_sock.getsockname()[1]}",
        )
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        admin_sock.close()
        shutil.rmtree(state, ignore_errors=True)


@contextmanager
def gateway_over(nodes: Sequence[NodeProcess], work: Path) -> Iterator[RunningGateway]:
    """A gateway with the default test config, its static directory (in `work`) listing `nodes`."""
    regions = write_regions(work / "regions.yaml", nodes)
    with run_gateway(gateway_config(regions)) as running:
        yield running

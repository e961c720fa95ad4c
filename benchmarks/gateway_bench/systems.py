"""The systems under test and the upstream they share, each started as a process of its own.

  direct     the fixed-response upstream itself (gateway_bench.upstream)
  meridian   `meridian gateway --config FILE` (the real CLI) with a static directory holding one
             node, the upstream; one tenant with no limits; in-process quota (no Redis)
  meridian_wN  the same with `--workers N` (N processes on one port), measured in the
             concurrency-32 phases only, to show how throughput scales with workers
  floor_*    --floor: the server and framework alone around one upstream exchange
             (gateway_bench.floor): what any gateway on this stack costs at least
  litellm    see gateway_bench.litellm_proxy

A `System` is what the load generator needs (URL, key, model) plus the processes whose CPU is
the proxy's own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from gateway.policy import hash_api_key
from gateway_bench.processes import Server, free_port, start_server, wait_until
from gateway_bench.upstream import JURISDICTION, MODEL, NODE_ID, REGION

BENCHMARKS = Path(__file__).resolve().parent.parent
REPO = BENCHMARKS.parent
MERIDIAN_KEY = "sk-meridian-bench"
NODE_TOKEN = "bench-node-token"


@dataclass
class System:
    name: str
    base_url: str
    api_key: str | None
    model: str = MODEL
    servers: list[Server] = field(default_factory=list)  # the proxy's processes (CPU accounting)
    is_upstream: bool = False  # "direct": its processes also serve every proxy's requests
    only_phases: frozenset[str] | None = None  # measured in these phases only; None: in all

    def measures(self, phase: str) -> bool:
        return self.only_phases is None or phase in self.only_phases

    def cpu_s(self) -> float:
        return sum(server.cpu_s() for server in self.servers)


def python_env(**extra: str) -> dict[str, str]:
    """The environment for our own Python processes: gateway_bench importable, output unbuffered."""
    path = os.pathsep.join(p for p in (str(BENCHMARKS), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def chat_answers(system: System, *, timeout_s: float = 5.0) -> bool:
    """One non-streamed chat request through `system` answers 200 (a node must also be routable)."""
    headers = {"authorization": f"Bearer {system.api_key}"} if system.api_key else {}
    body = {"model": system.model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 4}
    try:
        response = httpx.post(
            f"{system.base_url}/v1/chat/completions", json=body, headers=headers, timeout=timeout_s
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def start_upstream(work: Path, *, chunks: int) -> System:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway_bench.upstream", "--port", str(port), "--chunks", str(chunks)]
    server = start_server("upstream", cmd, log_dir=work, env=python_env(), cwd=REPO)
    system = System("direct", f"http://127.0.0.1:{port}", None, servers=[server], is_upstream=True)
    wait_until(server, lambda: chat_answers(system), timeout_s=30)
    return system


def start_floor(work: Path, upstream_url: str, kind: str) -> System:
    """gateway_bench.floor: the server, the framework and one upstream exchange, nothing else."""
    port = free_port()
    cmd = [sys.executable, "-m", "gateway_bench.floor", kind, "--port", str(port), "--upstream", upstream_url]
    server = start_server(f"floor_{kind}", cmd, log_dir=work, env=python_env(), cwd=REPO)
    system = System(f"floor_{kind}", f"http://127.0.0.1:{port}", None, servers=[server])
    wait_until(server, lambda: chat_answers(system), timeout_s=60)
    return system


def write_meridian_config(
    work: Path,
    upstream_url: str,
    port: int,
    extra: dict[str, object] | None = None,
    *,
    admin: bool = True,
) -> Path:
    """gateway.yaml, regions.yaml and a policies/ folder, as an operator would write them."""
    folder = work / "meridian"
    (folder / "policies").mkdir(parents=True, exist_ok=True)
    tenants = {"tenants": [{"id": "bench", "api_keys": [hash_api_key(MERIDIAN_KEY)], "models": "*"}]}
    (folder / "policies" / "bench.yaml").write_text(yaml.safe_dump(tenants))
    node = {
        "node_id": NODE_ID,
        "url": upstream_url,
        "region": REGION,
        "jurisdiction": JURISDICTION,
        "models": [MODEL],
    }
    (folder / "regions.yaml").write_text(yaml.safe_dump({"nodes": [node]}))
    config = {
        "home_region": REGION,
        "catalog": [{"name": MODEL, "tier": "small"}],
        "policies": "policies",
        "directory": {"type": "static", "file": "regions.yaml"},
        "listen": {"host": "127.0.0.1", "port": port},
        **({"admin": {"host": "127.0.0.1", "port": free_port()}} if admin else {}),  # /metrics, unused here
        **(extra or {}),
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_meridian(
    work: Path,
    upstream_url: str,
    *,
    workers: int = 1,
    only_phases: frozenset[str] | None = None,
    tree: Path | None = None,
    name: str | None = None,
    env: dict[str, str] | None = None,
    server: str = "uvicorn",
    extra_config: dict[str, object] | None = None,
) -> System:
    """Meridian from this checkout, or with `tree` from another one (named meridian_base): the
    same benchmark run then measures two versions of the code side by side, in the same
    conditions. `env` adds environment variables (e.g. OTEL_* to trace)."""
    name = name or (
        "meridian_base"
        if tree is not None
        else f"meridian_{server}"
        if server != "uvicorn"
        else "meridian"
        if workers == 1
        else f"meridian_w{workers}"
    )
    port = free_port()
    # A --compare-tree from before the admin listener (issue 31) would refuse the `admin:` key.
    admin = tree is None or "AdminListenConfig" in (tree / "gateway" / "config.py").read_text()
    config = write_meridian_config(work / name, upstream_url, port, extra_config, admin=admin)
    cmd = [sys.executable, "-m", "meridian.cli", "gateway", "--config", str(config)]
    if server != "uvicorn":  # the same app under another ASGI server (gateway_bench.other_servers)
        cmd = [sys.executable, "-m", "gateway_bench.other_servers", server, str(config), str(port)]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    if tree is None:
        process_env, cwd = python_env(MERIDIAN_NODE_TOKEN=NODE_TOKEN), REPO
    else:  # only that tree's code on the path, whatever this process runs with
        process_env = {
            **os.environ,
            "PYTHONPATH": str(tree),
            "PYTHONUNBUFFERED": "1",
            "MERIDIAN_NODE_TOKEN": NODE_TOKEN,
        }
        cwd = tree
    server = start_server(name, cmd, log_dir=work, env={**process_env, **(env or {})}, cwd=cwd)
    system = System(name, f"http://127.0.0.1:{port}", MERIDIAN_KEY, servers=[server], only_phases=only_phases)
    wait_until(server, lambda: chat_answers(system), timeout_s=60)
    return system

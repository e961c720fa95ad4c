"""`meridian up`: checkpoints on first run, one node per region, then the gateway in this process.

Ctrl-C (SIGINT) or SIGTERM stops the gateway, then every node's process group. Nodes are
protected by a random per-run token that only this gateway knows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from gateway.app import create_app
from gateway.config import ConfigError, load_config
from gateway.policy import PolicyError, key_digest
from gateway.runtime.serve import GatewayServer
from meridian.federation.options import UpOptions
from meridian.federation.plan import FederationPlan, ModelSpec, plan_federation
from meridian.federation.processes import ChildProcess, run_to_completion
from router.types import TenantPolicy

logger = logging.getLogger(__name__)
T = TypeVar("T")
Announce = Callable[[str], None]


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived while starting up."""


def demo_tenant(api_key: str) -> TenantPolicy:
    """The demo tenant: every model, any region, no limits — for trying the federation out."""
    return TenantPolicy(tenant_id="demo", api_key_hashes=frozenset({key_digest(api_key)}))


async def _until_stopped(work: Awaitable[T], stop: asyncio.Event) -> T:
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise Interrupted
    return task.result()


async def _ensure_checkpoints(plan: FederationPlan, env: dict[str, str], announce: Announce) -> None:
    """Missing checkpoints are made side by side (training uses one core each)."""
    missing = [m for m in plan.models if not (plan.checkpoint_dir(m) / "config.json").exists()]
    if not missing:
        return
    verb = "Training" if plan.trained else "Creating"
    names = ", ".join(f"{m.name} ({m.arch} {m.size})" for m in missing)
    announce(f"{verb} checkpoints {names} in {plan.state_dir / 'models'} (first run only)...")
    logs = {m.name: plan.log_dir / f"model-init-{m.name}.log" for m in missing}
    progress = asyncio.create_task(_report_progress(logs, announce)) if plan.trained else None
    try:
        await asyncio.gather(*(_make_checkpoint(plan, m, env, logs[m.name]) for m in missing))
    finally:
        if progress is not None:
            progress.cancel()
    for model in missing:
        summary = plan.checkpoint_dir(model) / "training.json"
        if summary.exists():
            record = json.loads(summary.read_text())
            announce(
                f"  {model.name}: held-out loss {record['held_out_loss']:.3f} "
                f"({record['held_out_bits_per_byte']:.3f} bits/byte), trained in {record['seconds']:.0f}s"
            )


async def _make_checkpoint(plan: FederationPlan, model: ModelSpec, env: dict[str, str], log: Path) -> None:
    target = plan.checkpoint_dir(model)
    partial = target.with_name(target.name + ".partial")
    await run_to_completion(
        f"model init {model.name}", plan.init_command(model, partial), env=env, log_path=log
    )
    # Renamed only when complete, so an interrupted first run never leaves half a checkpoint.
    os.replace(partial, target)


async def _report_progress(logs: dict[str, Path], announce: Announce, every_s: float = 10.0) -> None:
    """The training children's progress bars (the last one each drew in its log), every few seconds."""
    while True:
        await asyncio.sleep(every_s)
        states = []
        for name, log in logs.items():
            with contextlib.suppress(OSError):
                # Bytes, not read_text: universal newlines would turn the bar's \r into lines.
                text = log.read_bytes().decode("utf-8", errors="replace").strip()
                last = re.split(r"[\r\n]+", text)[-1] if text else ""
                step = (
                    "done" if "trained:" in last else last.split("] ", 1)[-1] if "] " in last else "starting"
                )
                states.append(f"{name} {step}")
        announce("  " + "; ".join(states))


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _banner(plan: FederationPlan, api_key: str, generated: bool) -> str:
    nodes = "\n".join(
        f"    {n.region:<8} ({n.jurisdiction})  {n.node_id}  {n.url}  log: {plan.log_dir / (n.node_id + '.log')}"
        for n in plan.nodes
    )
    models = ", ".join(f"{m.name} ({m.tier})" for m in plan.models)
    key_note = "generated for this run" if generated else "from MERIDIAN_DEMO_API_KEY"
    body = (
        '{"model": "meridian-small", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}'
    )
    return f"""
Meridian is ready.

  Gateway  {plan.url}/v1   (OpenAI-compatible)
  Metrics  {plan.admin_url}/metrics   (admin listener, loopback only: it names every tenant)
  Nodes
{nodes}
  Models   {models}
  API key  {api_key}   (demo tenant: all models, any region; {key_note})

Try it:
  curl {plan.url}/v1/chat/completions \\
    -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
    -d '{body}'

Ctrl-C stops the gateway and every node.
"""


async def run_up(options: UpOptions, *, announce: Announce = print) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if _port_in_use(options.host, options.port):
        announce(
            f"meridian up: {options.host}:{options.port} is already in use (set --port or MERIDIAN_PORT)"
        )
        return 1
    if _port_in_use("127.0.0.1", options.admin_port):
        announce(
            f"meridian up: 127.0.0.1:{options.admin_port} (the admin listener, /metrics) is already in use "
            "(set --admin-port or MERIDIAN_ADMIN_PORT)"
        )
        return 1
    plan = plan_federation(
        state_dir=options.state_dir,
        host=options.host,
        port=options.port,
        policies=options.policies,
        trained=options.trained,
        admin_port=options.admin_port,
    )
    plan.write_files()
    api_key = options.demo_api_key or f"sk-meridian-demo-{secrets.token_urlsafe(18)}"
    node_token = secrets.token_urlsafe(32)
    env = {**os.environ, "MERIDIAN_NODE_TOKEN": node_token, "PYTHONUNBUFFERED": "1"}
    # The nodes' engines set their own threads and cores (plan.py gives each node its
    # --engine-cpus; regional_node/server/README.md, "CPU share"); whatever else a node or a
    # training child computes with torch (loading a checkpoint) takes one thread.
    env.setdefault("OMP_NUM_THREADS", "1")
    nodes = [
        ChildProcess(n.node_id, plan.node_command(n), env=env, log_path=plan.log_dir / f"{n.node_id}.log")
        for n in plan.nodes
    ]
    server: GatewayServer | None = None
    watchers: list[asyncio.Task[None]] = []
    try:
        await _until_stopped(_ensure_checkpoints(plan, env, announce), stop)
        announce(f"Starting {len(nodes)} nodes ({', '.join(n.region for n in plan.nodes)})...")
        for node in nodes:
            await node.start()
        _write_run_file(plan, nodes)
        auth = {"authorization": f"Bearer {node_token}"}
        ready = [
            node.wait_ready(spec.url + "/ready", timeout_s=options.ready_timeout_s, headers=auth)
            for node, spec in zip(nodes, plan.nodes, strict=True)
        ]
        await _until_stopped(asyncio.gather(*ready), stop)
        config = load_config(plan.config_file)
        app = create_app(config, extra_policies=[demo_tenant(api_key)], env=env)
        server = GatewayServer(app, options.host, options.port)  # admin: the plan's config
        await _until_stopped(server.start(), stop)
        watchers = [asyncio.create_task(_watch(node, announce), name=f"watch-{node.name}") for node in nodes]
        announce(_banner(plan, api_key, generated=options.demo_api_key is None))
        await stop.wait()
        return 0
    except Interrupted:
        return 130
    except (ConfigError, PolicyError, RuntimeError, TimeoutError) as exc:
        announce(f"meridian up: {exc}")
        return 1
    finally:
        announce("Stopping...")
        for watcher in watchers:
            watcher.cancel()
        if server is not None:
            await server.stop()
        await asyncio.gather(*(node.stop() for node in nodes))
        plan.run_file.unlink(missing_ok=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        announce("Stopped.")


def _write_run_file(plan: FederationPlan, nodes: list[ChildProcess]) -> None:
    running = [
        {"node_id": spec.node_id, "pid": node.pid, "url": spec.url, "region": spec.region}
        for node, spec in zip(nodes, plan.nodes, strict=True)
    ]
    plan.run_file.write_text(json.dumps({"gateway": plan.url, "nodes": running}, indent=2))


async def _watch(node: ChildProcess, announce: Announce) -> None:
    code = await node.wait()
    announce(
        f"warning: node {node.name} exited with code {code}; the gateway routes around it. Log: {node.log_path}"
    )


def up_main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run_up(UpOptions.from_args(args), announce=lambda line: print(line, flush=True)))

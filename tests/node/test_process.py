"""The node as an operator runs it: `python -m regional_node node` with flags, stopped by SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.support.processes import free_port, python_command, start_process


def test_flag_configured_node_serves_and_exits_cleanly_on_sigterm(llama_checkpoint: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = python_command(
        "-m",
        "regional_node",
        "node",
        "--model",
        f"solo={llama_checkpoint}:large",
        "--port",
        str(port),
        "--region",
        "us-east",
        "--jurisdiction",
        "us",
        "--node-id",
        "solo-node",
        "--num-kv-blocks",
        "64",
    )
    with start_process(cmd, env={"MERIDIAN_NODE_TOKEN": ""}, ready_url=f"{url}/ready", timeout=90) as running:
        load = httpx.get(f"{url}/load").json()
        assert load["node_id"] == "solo-node" and load["models"] == [{"name": "solo", "tier": "large"}]
        assert load["kv_blocks_total"] == 64
        reply = httpx.post(f"{url}/v1/completions", json={"model": "solo", "prompt": "Hi", "max_tokens": 2})
        assert reply.status_code == 200
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=15) == 0
        assert "shut down cleanly" not in running.log()

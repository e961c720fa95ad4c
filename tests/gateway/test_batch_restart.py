"""A batch survives its gateway's SIGKILL: the gateway runs as an operator runs it (the CLI, a
process of its own); killed mid-batch and started again on the same database and files, it takes
the dead process's lines back once their leases lapse and finishes the batch with exactly one
answer per line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from gateway.policy import hash_api_key
from tests.gateway.conftest import NODE_TOKEN, NodeProcess, running_fleet, write_regions
from tests.support.processes import REPO_ROOT, free_port, python_command, stop_process, wait_http_ok

KEY = "sk-batch-restart"
LINES = 10


@pytest.fixture(scope="module")
def node(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    models = {"meridian-small": (llama_checkpoint, "small")}
    with running_fleet(
        [("eu-west-1", "eu-west", "eu")], models, tmp_path_factory.mktemp("node-logs")
    ) as fleet:
        yield fleet[0]


def write_config(folder: Path, node: NodeProcess, port: int) -> Path:
    (folder / "policies").mkdir(exist_ok=True)
    tenants = {"tenants": [{"id": "batcher", "api_keys": [hash_api_key(KEY)], "models": "*"}]}
    (folder / "policies" / "batcher.yaml").write_text(yaml.safe_dump(tenants))
    write_regions(folder / "regions.yaml", [node])
    config = {
        "home_region": "eu-west",
        "catalog": [{"name": "meridian-small", "tier": "small"}],
        "policies": "policies",
        "directory": {"type": "static", "file": "regions.yaml"},
        "listen": {"host": "127.0.0.1", "port": port},
        "admin": {"host": "127.0.0.1", "port": free_port()},  # /metrics; never a fixed port in tests
        "ledger": {"store": {"path": "ledger.sqlite"}},
        # Short leases: the restarted gateway takes the dead one's lines back within seconds.
        "batches": {
            "enabled": True,
            "storage_dir": "files",
            "lease_s": 2,
            "concurrency": 1,
            "poll_interval_s": 0.1,
        },
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_gateway(folder: Path, node: NodeProcess, log_name: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = write_config(folder, node, port)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MERIDIAN_NODE_TOKEN": NODE_TOKEN}
    with open(folder / log_name, "wb") as log:
        process = subprocess.Popen(
            python_command("-m", "meridian.cli", "gateway", "--config", str(config)),
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/health", 90, process=process)
    except (TimeoutError, RuntimeError) as exc:
        stop_process(process)
        raise RuntimeError(f"{exc}\n{(folder / log_name).read_text(errors='replace')[-4000:]}") from None
    return process, url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.mark.timeout(300)
def test_a_batch_finishes_once_per_line_after_its_gateway_is_killed(
    node: NodeProcess, tmp_path: Path
) -> None:
    first, url = start_gateway(tmp_path, node, "first.log")
    try:
        lines = [
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "meridian-small",
                    "messages": [{"role": "user", "content": f"Story number {i}"}],
                    "max_tokens": 48,
                    "temperature": 0,
                },
            }
            for i in range(LINES)
        ]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        api = client(url)
        file_id = api.files.create(file=("in.jsonl", data), purpose="batch").id
        batch_id = api.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        deadline = time.monotonic() + 120
        while True:  # some lines answered, some not: the gateway dies mid-batch
            counts = api.batches.retrieve(batch_id).request_counts
            assert counts is not None
            if counts.completed >= 2:
                break
            assert time.monotonic() < deadline, "the batch did not start"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        stop_process(first)
    assert counts.completed < LINES, "the batch finished before the gateway was killed"

    second, url = start_gateway(tmp_path, node, "second.log")
    try:
        api = client(url)
        deadline = time.monotonic() + 180
        while (batch := api.batches.retrieve(batch_id)).status != "completed":
            assert batch.status in ("validating", "in_progress", "finalizing"), batch.status
            assert time.monotonic() < deadline, f"the batch did not finish: {batch.request_counts}"
            time.sleep(0.2)
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES, 0)
        assert batch.output_file_id is not None
        output = [json.loads(line) for line in api.files.content(batch.output_file_id).text.splitlines()]
        assert sorted(line["custom_id"] for line in output) == sorted(line["custom_id"] for line in lines)
        assert all(line["response"]["status_code"] == 200 for line in output)
    finally:
        stop_process(second)

"""`meridian gateway --workers N`: N processes behind one port, supervised by the CLI's process.

Real processes: the CLI as an operator runs it, with a config that lists no nodes (the health
and model routes need none). Which process answered is the `pid` in `/health`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.policy import hash_api_key
from tests.support.processes import REPO_ROOT, free_port, python_command, stop_process, wait_http_ok

KEY = "sk-workers-test"
START_TIMEOUT_S = 90.0


def _write_config(folder: Path, port: int, admin_port: int) -> Path:
    (folder / "policies").mkdir()
    tenants = {"tenants": [{"id": "workers", "api_keys": [hash_api_key(KEY)], "models": "*"}]}
    (folder / "policies" / "workers.yaml").write_text(yaml.safe_dump(tenants))
    (folder / "regions.yaml").write_text(yaml.safe_dump({"nodes": []}))
    config = {
        "home_region": "eu-west",
        "catalog": [{"name": "meridian-small", "tier": "small"}],
        "policies": "policies",
        "directory": {"type": "static", "file": "regions.yaml"},
        "listen": {"host": "127.0.0.1", "port": port},
        "admin": {"host": "127.0.0.1", "port": admin_port},  # /metrics; never a fixed port in tests
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Gateway:
    def __init__(self, process: subprocess.Popen[bytes], url: str, admin_url: str, log_path: Path) -> None:
        self.process = process
        self.url = url
        self.admin_url = admin_url
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self, want: int, timeout_s: float = 30.0) -> set[int]:
        """Ask /health on fresh connections (the kernel spreads those over the workers' sockets
        by source port) until `want` distinct processes have answered."""
        seen: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(seen) < want:
            assert time.monotonic() < deadline, f"only {seen} answered:\n{self.log()[-3000:]}"
            with httpx.Client() as client:  # a new connection per request
                seen.add(client.get(self.url + "/health", timeout=5).json()["pid"])
        return seen


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    port, admin_port = free_port(), free_port()
    config = _write_config(tmp_path, port, admin_port)
    log_path = tmp_path / "gateway.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MERIDIAN_NODE_TOKEN": "t"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            python_command("-m", "meridian.cli", "gateway", "--config", str(config), "--workers", "2"),
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Gateway(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", log_path)
    try:
        try:
            wait_http_ok(running.url + "/health", START_TIMEOUT_S, process=process)
        except (TimeoutError, RuntimeError) as exc:
            raise RuntimeError(f"{exc}\n{running.log()[-4000:]}") from None
        yield running
    finally:
        stop_process(process)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_exit(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> int:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail("the supervisor did not exit")


@pytest.mark.timeout(180)
def test_two_workers_answer_on_one_port_and_sigterm_stops_them_all(gateway: Gateway) -> None:
    pids = gateway.worker_pids(2)
    assert gateway.process.pid not in pids, "the supervisor must not serve requests itself"
    # Each worker built the whole app: the tenant's models answer whoever serves the request.
    for _ in range(6):
        with httpx.Client() as client:
            models = client.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {KEY}"})
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["meridian-small"]
    assert "each worker keeps its own counters" in gateway.log(), "no warning about per-worker quotas"
    # Every worker serves /metrics on the shared admin port, none on the public one.
    for _ in range(4):
        with httpx.Client() as client:
            assert "meridian_gateway_requests_total" in client.get(gateway.admin_url + "/metrics").text
            assert client.get(gateway.url + "/metrics").status_code == 404

    gateway.process.send_signal(signal.SIGTERM)
    assert _wait_exit(gateway.process) == 0
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, "a worker outlived its supervisor"
        time.sleep(0.05)
    for url in (gateway.url + "/health", gateway.admin_url + "/metrics"):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, timeout=2)


@pytest.mark.timeout(180)
def test_a_worker_that_dies_is_reported_and_stops_the_gateway(gateway: Gateway) -> None:
    victim, survivor = sorted(gateway.worker_pids(2))
    os.kill(victim, signal.SIGKILL)

    assert _wait_exit(gateway.process) == 1
    assert f"(pid {victim}) exited unexpectedly with signal SIGKILL" in gateway.log()
    deadline = time.monotonic() + 10
    while not _gone(survivor):
        assert time.monotonic() < deadline, "the other worker was left running"
        time.sleep(0.05)


@pytest.mark.parametrize(("taken_port", "workers"), [("public", "2"), ("admin", "2"), ("admin", "1")])
def test_a_port_in_use_stops_start_up_with_exit_1(tmp_path: Path, taken_port: str, workers: str) -> None:
    with socket.socket() as taken:  # an ordinary listener, without SO_REUSEPORT
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = free_port()
        public, admin = (port, other) if taken_port == "public" else (other, port)
        config = _write_config(tmp_path, public, admin)
        result = subprocess.run(
            python_command("-m", "meridian.cli", "gateway", "--config", str(config), "--workers", workers),
            env={**os.environ, "MERIDIAN_NODE_TOKEN": "t"},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr or (
        taken_port == "admin" and f"127.0.0.1:{port} (admin)" in result.stderr
    ), result.stderr[-2000:]

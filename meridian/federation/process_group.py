"""Process groups on this machine: a free loopback port to start a server on, and stopping a
server's whole group (SIGTERM, then SIGKILL), so that nothing it spawned outlives it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
from pathlib import Path


def _below_ephemeral() -> range | None:
    """The ports from 10000 up to the kernel's ephemeral range, which no outgoing connection is
    given; None where the range cannot be read or leaves too few."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(10_000, low) if low - 10_000 >= 1_000 else None


_PORTS = _below_ephemeral()
_lock = threading.Lock()
# Where this process starts in the range, at random: two processes (test workers, a federation
# beside the tests) walk it from far apart, and each call takes the next port.
_cursor = random.SystemRandom().randrange(len(_PORTS)) if _PORTS is not None else 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, for a server to bind a moment later.

    Taken below the kernel's ephemeral range where it can be read: a port the kernel picks for
    `bind(port 0)` is drawn from the range every outgoing connection's port is drawn from, so one
    of the many connections a busy machine opens could take it before the server binds it (seen:
    a gateway's admin port, under the test suite's load)."""
    global _cursor
    if _PORTS is not None:
        with _lock:
            for _ in range(len(_PORTS)):
                _cursor = (_cursor + 1) % len(_PORTS)
                port = _PORTS[_cursor]
                if _bindable(host, port):
                    return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def stop_process_group(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> int | None:
    """SIGTERM the process group, wait up to `grace_s` seconds, then SIGKILL it. Returns the exit code.

    The process must have been started with `start_new_session=True` (it leads its own group)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=grace_s)
    # Children the group leader left behind (it exited, they did not) go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.returncode

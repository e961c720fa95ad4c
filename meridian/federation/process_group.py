"""Process groups on this machine: a free loopback port to start a server on, and stopping a
server's whole group (SIGTERM, then SIGKILL), so that nothing it spawned outlives it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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

"""Server processes for the benchmark: free ports, start-and-wait, CPU accounting, clean stop.

Each server runs in its own session (process group), so stopping the group also ends anything it
spawned (LiteLLM's CLI may fork a worker). Output goes to a log file in the run's work folder,
whose tail is shown when a server fails to come up.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from meridian.federation.process_group import free_port, stop_process_group

__all__ = [
    "Server",
    "free_port",
    "process_tree_cpu_s",
    "process_tree_rss_mb",
    "start_server",
    "stop_server",
    "wait_until",
]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the server and every live descendant."""
        return process_tree_cpu_s(self.process.pid)

    def rss_mb(self) -> float:
        """Resident memory (VmRSS) of the server and every live descendant, in MiB."""
        return process_tree_rss_mb(self.process.pid)


def start_server(
    name: str, cmd: Sequence[str], *, log_dir: Path, env: Mapping[str, str], cwd: Path
) -> Server:
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            list(cmd),
            env=dict(env),
            cwd=str(cwd),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Server(name, process, log_path)


def wait_until(server: Server, ready: Callable[[], bool], timeout_s: float) -> None:
    """Poll `ready()` until it is true; RuntimeError (with the log's tail) on exit or timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.process.returncode} before it was ready:\n{server.log_tail()}"
            )
        if ready():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.name} was not ready within {timeout_s:.0f}s:\n{server.log_tail()}")
        time.sleep(0.2)


def stop_server(server: Server, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace_s`."""
    stop_process_group(server.process, grace_s)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; every field after its closing ')' is plain.
    return text[text.rindex(")") + 2 :].split()


def _descendants(root: int) -> list[int]:
    """`root` and every live process below it, from /proc (Linux only; empty elsewhere)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None:
            parents[int(entry)] = int(fields[1])  # after the name: state(0) ppid(1)
    tree = []
    for pid in parents:
        walk = pid
        while walk in parents and walk != root:
            walk = parents[walk]
        if walk == root:
            tree.append(pid)
    return tree


def process_tree_cpu_s(root: int) -> float:
    """utime + stime of `root` and its descendants (stat fields 14 and 15)."""
    total = 0.0
    for pid in _descendants(root):
        fields = _stat_fields(pid)
        if fields is not None:  # after the name, utime and stime are fields 11 and 12
            total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return total


def process_tree_rss_mb(root: int) -> float:
    """VmRSS of `root` and its descendants, from /proc/PID/status, in MiB."""
    total_kb = 0
    for pid in _descendants(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kb += int(line.split()[1])  # "VmRSS:   12345 kB"
                break
    return total_kb / 1024

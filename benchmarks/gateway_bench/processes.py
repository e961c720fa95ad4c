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

__all__ = ["Server", "free_port", "process_tree_cpu_s", "start_server", "stop_server", "wait_until"]

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


def process_tree_cpu_s(root: int) -> float:
    """utime + stime of `root` and its descendants, from /proc (Linux only; 0.0 elsewhere)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None:
            continue
        # After the name: state(0) ppid(1) ... utime(11) stime(12), i.e. stat fields 4, 14 and 15.
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    total = 0.0
    for pid in cpu:
        walk = pid
        while walk in parents and walk != root:
            walk = parents[walk]
        if walk == root:
            total += cpu[pid]
    return total

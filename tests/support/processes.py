"""Real server processes for integration tests: a free loopback port, start-and-wait, clean kill.

Each process runs in its own session (process group), so killing the group also ends anything it
spawned; its output goes to a temporary log file that is printed when start-up fails, so a test
that cannot reach its server says why.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from meridian.federation.process_group import free_port, stop_process_group

REPO_ROOT = Path(__file__).resolve().parents[2]


__all__ = [
    "REPO_ROOT",
    "RunningProcess",
    "free_port",
    "python_command",
    "start_process",
    "stop_process",
    "wait_http_ok",
]


def wait_http_ok(
    url: str,
    timeout: float,
    *,
    headers: Mapping[str, str] | None = None,
    process: subprocess.Popen[bytes] | None = None,
) -> httpx.Response:
    """Poll `url` until it answers 200; raise TimeoutError after `timeout` seconds.

    With `process`, give up early (RuntimeError) if that process exits, rather than waiting out
    the timeout for a server that already crashed.
    """
    deadline = time.monotonic() + timeout
    last: str = "no answer yet"
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered 200")
        try:
            response = httpx.get(url, headers=dict(headers or {}), timeout=2.0)
            if response.status_code == 200:
                return response
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f}s (last: {last})")
        time.sleep(0.1)


@dataclass
class RunningProcess:
    """A started server: its Popen handle and where its combined stdout/stderr goes."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def python_command(*args: str) -> list[str]:
    """`[sys.executable, *args]`: the test run's own interpreter (the venv's)."""
    return [sys.executable, *args]


@contextlib.contextmanager
def start_process(
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    ready_url: str | None = None,
    timeout: float = 60.0,
    *,
    ready_headers: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[RunningProcess]:
    """Run `cmd` (env: added to os.environ), wait until `ready_url` answers 200, yield it.

    On exit the whole process group gets SIGTERM, then SIGKILL if it has not gone within a few
    seconds. If start-up fails, the error carries the tail of the process's log.
    """
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.NamedTemporaryFile(prefix="meridian-proc-", suffix=".log", delete=False) as log_file:
        log_path = Path(log_file.name)
    with open(log_path, "wb") as log_out:
        process = subprocess.Popen(
            list(cmd),
            env=full_env,
            cwd=str(cwd or REPO_ROOT),
            stdout=log_out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = RunningProcess(process, log_path)
    try:
        if ready_url is not None:
            try:
                wait_http_ok(ready_url, timeout, headers=ready_headers, process=process)
            except (TimeoutError, RuntimeError) as exc:
                raise RuntimeError(f"{exc}\n--- process log (tail) ---\n{running.log()[-4000:]}") from None
        yield running
    finally:
        stop_process(process)
        log_path.unlink(missing_ok=True)


def stop_process(process: subprocess.Popen[bytes], grace: float = 5.0) -> int | None:
    """SIGTERM the process group, wait up to `grace` seconds, then SIGKILL it. Returns the exit code."""
    return stop_process_group(process, grace)

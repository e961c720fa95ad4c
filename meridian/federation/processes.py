"""Child processes of `meridian up`: each in its own process group, so stopping it ends
everything it started; on Linux each also gets SIGTERM if the supervisor itself dies."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import httpx

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: no orphans even if `meridian up` is SIGKILLed."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    def __init__(self, name: str, command: Sequence[str], *, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = log_path
        self._env = env
        self._process: asyncio.subprocess.Process | None = None

    def _open_log(self) -> BinaryIO:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Closed by start() as soon as the child holds its own descriptor.
        return open(self.log_path, "ab")

    async def start(self) -> None:
        with self._open_log() as log:
            self._process = await asyncio.create_subprocess_exec(
                *self.command,
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg reaches its children too
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def returncode(self) -> int | None:
        return self._process.returncode if self._process else None

    async def wait(self) -> int:
        assert self._process is not None
        return await self._process.wait()

    async def wait_ready(self, url: str, *, timeout_s: float, headers: dict[str, str]) -> None:
        """Poll `url` until 200; RuntimeError if the process exits first, TimeoutError after timeout_s."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if self.returncode() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with code {self.returncode()}; see {self.log_path}\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url, headers=headers)).status_code == 200:
                        return
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(
                        f"{self.name} was not ready within {timeout_s:.0f}s; see {self.log_path}"
                    )
                await asyncio.sleep(0.25)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    async def stop(self, grace_s: float = 8.0) -> None:
        """SIGTERM the group, SIGKILL it after `grace_s`; also reaps group members left behind."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


async def run_to_completion(
    name: str, command: Sequence[str], *, env: dict[str, str], log_path: Path
) -> None:
    """Run a short command (e.g. checkpoint creation); RuntimeError with its log tail if it fails."""
    child = ChildProcess(name, command, env=env, log_path=log_path)
    await child.start()
    try:
        code = await child.wait()
    finally:
        await child.stop(grace_s=2.0)
    if code != 0:
        raise RuntimeError(f"{name} failed with code {code}:\n{child.log_tail()}")

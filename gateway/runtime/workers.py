"""`meridian gateway --workers N`: N gateway processes answering on one port.

The parent binds N listening sockets to the port with SO_REUSEPORT, one per worker, and the
kernel spreads incoming connections over them; no process sits between a client and a worker.
Each worker is a fresh process (spawned, not forked) that builds its own app from the config and
serves its socket with uvicorn, so workers share nothing: each has its own node connections,
health view and, with the in-process quota store, its own quota counters.

The parent only supervises. SIGTERM or SIGINT is passed on to every worker as SIGTERM (a second
SIGINT kills them); a worker that exits while no stop was asked for is reported, and the others are
then stopped and the parent exits 1, so that whatever runs the gateway (systemd, Kubernetes)
restarts it whole rather than leaving it to serve with fewer workers than configured.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from litestar import Litestar

from gateway.runtime.serve import ServingServer, uvicorn_config

logger = logging.getLogger(__name__)

AppFactory = Callable[[], Litestar]  # picklable: a module-level function (workers are spawned)
_BACKLOG = 2048  # uvicorn's default
_PR_SET_PDEATHSIG = 1


def bind_reuseport(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other SO_REUSEPORT sockets of this user may share."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker if the supervisor dies (even by SIGKILL): no orphans
    holding the port. Elsewhere this is a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _WorkerServer(ServingServer):
    """Any signal asks for a graceful stop. Ctrl-C reaches a worker twice (from the terminal and
    from the supervisor), which plain uvicorn would take as "force quit"; forcing is the
    supervisor's call (SIGKILL on a second SIGINT)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.should_exit = True


def _serve_worker(build_app: AppFactory, sock: socket.socket, supervisor: int, log_level: str) -> None:
    """A worker's whole life: build the app, serve the inherited socket until SIGTERM."""
    _die_with_parent()
    if os.getppid() != supervisor:  # it died before prctl took effect
        return
    app = build_app()
    host, port = sock.getsockname()[:2]
    _WorkerServer(uvicorn_config(app, host, port, log_level=log_level)).run(sockets=[sock])


class _Supervisor:
    def __init__(self, workers: list[BaseProcess]) -> None:
        self.workers = workers
        self.stopping = False

    def on_signal(self, signum: int, _: FrameType | None) -> None:
        if self.stopping:
            # As uvicorn does: a second Ctrl-C forces the exit; a repeated SIGTERM (a service
            # manager and a wrapper both passing one on) changes nothing.
            if signum == signal.SIGINT:
                logger.warning("second SIGINT: killing the workers")
                self.signal_all(signal.SIGKILL)
            return
        logger.info("%s: stopping %d workers", signal.Signals(signum).name, len(self.workers))
        self.stopping = True
        self.signal_all(signal.SIGTERM)

    def signal_all(self, signum: int) -> None:
        for worker in self.workers:
            if worker.pid is not None and worker.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signum)

    def wait_all(self) -> int:
        """Block until every worker has exited; 0 if they were asked to, else 1."""
        failed = False
        running = list(self.workers)
        while running:
            for sentinel in wait([w.sentinel for w in running]):
                worker = next(w for w in running if w.sentinel == sentinel)
                worker.join()
                running.remove(worker)
                if not self.stopping:
                    logger.error(
                        "gateway worker %s (pid %s) exited unexpectedly with %s; stopping the others",
                        worker.name,
                        worker.pid,
                        _describe(worker.exitcode),
                    )
                    failed = self.stopping = True
                    self.signal_all(signal.SIGTERM)
        return 1 if failed else 0


def _describe(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"signal {signal.Signals(-exitcode).name}"
    return f"code {exitcode}"


def run_workers(build_app: AppFactory, host: str, port: int, workers: int, *, log_level: str = "info") -> int:
    """Serve with `workers` processes until SIGTERM/SIGINT; 1 if the port cannot be bound or a
    worker died on its own."""
    assert workers >= 2, "one worker is run_gateway's job"
    sockets: list[socket.socket] = []
    try:
        for _ in range(workers):
            sockets.append(bind_reuseport(host, port))
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", host, port, exc)
        for sock in sockets:
            sock.close()
        return 1
    spawn = multiprocessing.get_context("spawn")
    supervisor = _Supervisor([])
    previous = {sig: signal.signal(sig, supervisor.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index, sock in enumerate(sockets):
            if supervisor.stopping:  # a signal came while the workers were being started
                break
            process = spawn.Process(
                target=_serve_worker,
                args=(build_app, sock, os.getpid(), log_level),
                name=f"gateway-worker-{index}",
            )
            process.start()
            supervisor.workers.append(process)
        # The workers hold their own copies; the parent must not keep the port open after them.
        for sock in sockets:
            sock.close()
        logger.info(
            "gateway on http://%s:%d with %d workers (pids %s)",
            host,
            port,
            len(supervisor.workers),
            ", ".join(str(p.pid) for p in supervisor.workers),
        )
        return supervisor.wait_all()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

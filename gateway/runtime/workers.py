"""`meridian gateway --workers N`: N gateway processes answering on one port.

The parent binds N listening sockets to the port with SO_REUSEPORT, one per worker, and the
kernel spreads incoming connections over them; no process sits between a client and a worker.
Each worker is a fresh process (spawned, not forked) that builds its own app from the config and
serves its socket with uvicorn (and its own admin listener socket, /metrics, on the shared admin
port: a scrape reads one worker's metrics), so workers share nothing: each has its own node connections,
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
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import uvicorn
from litestar import Litestar

from gateway.runtime.serve import (
    ServingServer,
    admin_config,
    bind,
    run_with_loop,
    serve_with_admin,
    uvicorn_config,
)

logger = logging.getLogger(__name__)

AppFactory = Callable[[], Litestar]  # picklable: a module-level function (workers are spawned)
_PR_SET_PDEATHSIG = 1


def bind_reuseport(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other SO_REUSEPORT sockets of this user may share."""
    return bind(host, port, reuse_port=True)


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


class _WorkerAdminServer(_WorkerServer):
    """The worker's admin listener: its stop comes from the public server's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await uvicorn.Server.startup(self, sockets=sockets)  # no second collector tuning


def _serve_worker(
    build_app: AppFactory, sock: socket.socket, admin_sock: socket.socket, supervisor: int, log_level: str
) -> None:
    """A worker's whole life: build the app, serve the inherited sockets (public and admin) until
    SIGTERM."""
    _die_with_parent()
    if os.getppid() != supervisor:  # it died before prctl took effect
        return
    app = build_app()
    host, port = sock.getsockname()[:2]
    config = uvicorn_config(app, host, port, log_level=log_level)
    server = _WorkerServer(config)
    admin = _WorkerAdminServer(admin_config(app, admin_sock, log_level=log_level))
    run_with_loop(config, serve_with_admin(server, admin, admin_sock, sockets=[sock]))


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


def run_workers(
    build_app: AppFactory,
    host: str,
    port: int,
    workers: int,
    *,
    admin: tuple[str, int],
    log_level: str = "info",
) -> int:
    """Serve with `workers` processes until SIGTERM/SIGINT, each with its own admin listener
    socket on the shared `admin` port (so a scrape reads one worker's metrics, as a public
    request reaches one worker); 1 if a port cannot be bound or a worker died on its own."""
    assert workers >= 2, "one worker is run_gateway's job"
    sockets: list[socket.socket] = []
    admin_sockets: list[socket.socket] = []
    try:
        for _ in range(workers):
            sockets.append(bind_reuseport(host, port))
        for _ in range(workers):
            admin_sockets.append(bind(*admin, reuse_port=True))
    except OSError as exc:
        logger.error("cannot listen on %s:%d or %s:%d (admin): %s", host, port, *admin, exc)
        for sock in sockets + admin_sockets:
            sock.close()
        return 1
    spawn = multiprocessing.get_context("spawn")
    supervisor = _Supervisor([])
    previous = {sig: signal.signal(sig, supervisor.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index, (sock, admin_sock) in enumerate(zip(sockets, admin_sockets, strict=True)):
            if supervisor.stopping:  # a signal came while the workers were being started
                break
            process = spawn.Process(
                target=_serve_worker,
                args=(build_app, sock, admin_sock, os.getpid(), log_level),
                name=f"gateway-worker-{index}",
            )
            process.start()
            supervisor.workers.append(process)
        # The workers hold their own copies; the parent must not keep the port open after them.
        for sock in sockets + admin_sockets:
            sock.close()
        logger.info(
            "gateway on http://%s:%d (admin listener, /metrics: http://%s:%d) with %d workers (pids %s)",
            host,
            port,
            *admin,
            len(supervisor.workers),
            ", ".join(str(p.pid) for p in supervisor.workers),
        )
        return supervisor.wait_all()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""Serving a gateway app with uvicorn: blocking (`meridian gateway`) or as a task (`meridian up`).

Every gateway process serves two listeners from one event loop: the public one (`listen:`, the
front doors, `/health`, `/ready`) and the admin one (`admin:`, `/metrics`, which names every
tenant with its tokens and cost). The admin socket is bound before anything starts, so a taken
port stops start-up with a plain error; the admin server has no lifespan: the public app owns the
gateway's start and stop, and the admin server stops when the public one does."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
from collections.abc import Coroutine, Iterator
from typing import Any

import uvicorn
from litestar import Litestar

from gateway.api.doors import ClientDepartures
from gateway.app import Gateway, create_admin_app
from gateway.upstreams.providers.anthropic_errors import anthropic_error
from http_server import server_config

logger = logging.getLogger(__name__)
_BACKLOG = 2048  # uvicorn's default


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 takes a free one. With `reuse_port`, other
    SO_REUSEPORT sockets of this user may share the port (`--workers`). OSError if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def uvicorn_config(app: Litestar, host: str, port: int, *, log_level: str = "warning") -> uvicorn.Config:
    """The gateway app's server config; the limits are its own config's `server` section."""
    gateway: Gateway = app.state["gateway"]
    return server_config(
        ClientDepartures(app),
        host,
        port,
        gateway.config.server,
        # A request refused before the app (a malformed header) still answers in its door's format.
        error_formats={"/v1/messages": anthropic_error},
        # A client that leaves releases its upstream, quota and admission at once (api/doors.py).
        cancel_on_disconnect=True,
        lifespan="on",
        log_level=log_level,
        access_log=False,
        # Nothing in the gateway reads the client's address, so uvicorn's X-Forwarded-For
        # rewriting (an extra ASGI layer on every request) buys nothing.
        proxy_headers=False,
        timeout_graceful_shutdown=5,
    )


def admin_config(app: Litestar, sock: socket.socket, *, log_level: str = "warning") -> uvicorn.Config:
    """The admin listener's server config, on `sock` (bound by `bind`), for the public `app`'s gateway."""
    gateway: Gateway = app.state["gateway"]
    host, port = sock.getsockname()[:2]
    return server_config(
        create_admin_app(gateway),
        host,
        port,
        gateway.config.server,
        lifespan="off",  # the public app's lifespan starts and stops the gateway
        log_level=log_level,
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=1,
    )


def admin_address(app: Litestar) -> tuple[str, int]:
    """Where the config puts the admin listener (`admin:`)."""
    gateway: Gateway = app.state["gateway"]
    return gateway.config.admin.host, gateway.config.admin.port


# The request path allocates a few hundred container objects per request. At Python's default
# threshold (700) a young-generation collection ran every couple of requests, and the older ones
# rescanned the whole app; measured on the gateway benchmark, raising the thresholds and freezing
# what start-up built cut the gateway's CPU per request by about a tenth and its p99 by half.
# Cycles are still collected, only in larger batches (RSS stays flat over 100,000 requests).
_GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc_for_serving() -> None:
    """Once the app has started: move what start-up built out of the collector's way (gc.freeze)
    and collect young objects in larger batches. Process-wide, so only servers call it."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)


class ServingServer(uvicorn.Server):
    """uvicorn's server, tuning the collector once the app's start-up (lifespan) has run."""

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            tune_gc_for_serving()


class _Server(ServingServer):
    """A uvicorn server whose owner handles signals (it stops it with `should_exit`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _AdminServer(uvicorn.Server):
    """The admin listener: no signals of its own (the public server's stop ends it), and no
    collector tuning (the public server does that, once per process)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_with_admin(
    server: uvicorn.Server,
    admin: uvicorn.Server,
    admin_sock: socket.socket,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve the public `server` (on `sockets`, else its config's address) until it stops, with
    the admin server on `admin_sock` beside it; the admin server stops after the public one."""
    admin_task = asyncio.create_task(admin.serve(sockets=[admin_sock]), name="gateway-admin-server")
    try:
        await server.serve(sockets=sockets)
    finally:
        admin.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await admin_task


def run_with_loop(config: uvicorn.Config, main: Coroutine[Any, Any, None]) -> None:
    """Run `main` in a new event loop of the kind `config` names (uvloop), as uvicorn's run() does."""
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(main)


def run_gateway(app: Litestar, host: str, port: int, admin: tuple[str, int] | None = None) -> int:
    """Serve until SIGINT/SIGTERM (uvicorn's own handlers), the admin listener at `admin` (default:
    the config's `admin:`). 1 if a server could not start."""
    admin_host, admin_port = admin or admin_address(app)
    try:
        admin_sock = bind(admin_host, admin_port)
    except OSError as exc:
        logger.error(
            "cannot listen on %s:%d for the admin listener (/metrics): %s", admin_host, admin_port, exc
        )
        return 1
    logger.info("admin listener (/metrics) on http://%s:%d", admin_host, admin_sock.getsockname()[1])
    config = uvicorn_config(app, host, port, log_level="info")
    server = ServingServer(config)
    admin_server = _AdminServer(admin_config(app, admin_sock))
    try:
        run_with_loop(config, serve_with_admin(server, admin_server, admin_sock))
    except SystemExit as exc:  # uvicorn exits when it cannot bind the port
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        admin_sock.close()
    return 0 if server.started else 1


class GatewayServer:
    """A gateway served in the current event loop, with its admin listener at `admin` (default:
    the config's `admin:`; port 0 takes a free one); `start` returns once both listen."""

    def __init__(self, app: Litestar, host: str, port: int, admin: tuple[str, int] | None = None) -> None:
        self._server = _Server(uvicorn_config(app, host, port))
        self._where = f"{host}:{port}"
        self._app = app
        self._admin = admin or admin_address(app)
        self._admin_sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def admin_url(self) -> str:
        """The admin listener's base URL (its port as bound); valid once started."""
        assert self._admin_sock is not None, "not started"
        host, port = self._admin_sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self, timeout_s: float = 30.0) -> None:
        host, port = self._admin
        try:
            self._admin_sock = bind(host, port)
        except OSError as exc:
            raise RuntimeError(f"the admin listener cannot listen on {host}:{port}: {exc}") from None
        admin = _AdminServer(admin_config(self._app, self._admin_sock))
        self._task = asyncio.create_task(
            serve_with_admin(self._server, admin, self._admin_sock), name="gateway-server"
        )
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._server.started:
            if self._task.done():
                try:
                    await self._task
                except SystemExit:  # uvicorn exits when it cannot bind the port
                    pass
                raise RuntimeError(f"the gateway did not start on {self._where} (see the log above)")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("the gateway did not start listening in time")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self._task
        self._task = None
        if self._admin_sock is not None:
            self._admin_sock.close()
            self._admin_sock = None

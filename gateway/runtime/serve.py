"""Serving a gateway app with uvicorn: blocking (`meridian gateway`) or as a task (`meridian up`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import uvicorn
from litestar import Litestar

from gateway.upstreams.providers.anthropic_errors import anthropic_error
from http_server import server_config

if TYPE_CHECKING:
    from gateway.app import Gateway


def uvicorn_config(app: Litestar, host: str, port: int, *, log_level: str = "warning") -> uvicorn.Config:
    """The gateway app's server config; the limits are its own config's `server` section."""
    gateway: Gateway = app.state["gateway"]
    return server_config(
        app,
        host,
        port,
        gateway.config.server,
        # A request refused before the app (a malformed header) still answers in its door's format.
        error_formats={"/v1/messages": anthropic_error},
        lifespan="on",
        log_level=log_level,
        access_log=False,
        # Nothing in the gateway reads the client's address, so uvicorn's X-Forwarded-For
        # rewriting (an extra ASGI layer on every request) buys nothing.
        proxy_headers=False,
        timeout_graceful_shutdown=5,
    )


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


def run_gateway(app: Litestar, host: str, port: int) -> int:
    """Serve until SIGINT/SIGTERM (uvicorn's own handlers). 1 if the server could not start."""
    server = ServingServer(uvicorn_config(app, host, port, log_level="info"))
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind the port
        return exc.code if isinstance(exc.code, int) else 1
    return 0 if server.started else 1


class _Server(ServingServer):
    """A uvicorn server whose owner handles signals (it stops it with `should_exit`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class GatewayServer:
    """A gateway served in the current event loop; `start` returns once it listens."""

    def __init__(self, app: Litestar, host: str, port: int) -> None:
        self._server = _Server(uvicorn_config(app, host, port))
        self._where = f"{host}:{port}"
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 30.0) -> None:
        self._task = asyncio.create_task(self._server.serve(), name="gateway-server")
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

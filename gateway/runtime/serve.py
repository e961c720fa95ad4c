"""Serving a gateway app with uvicorn: blocking (`meridian gateway`) or as a task (`meridian up`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
from collections.abc import Iterator
from typing import Any

import uvicorn
from litestar import Litestar

from gateway.config import ServerConfig


def server_config(app: Litestar) -> ServerConfig:
    """The `server:` section of the config `app` was built from (create_app keeps its Gateway in
    the app's state), so every way of serving it (one process, workers, `meridian up`) honours it."""
    gateway = app.state.get("gateway")
    return gateway.config.server if gateway is not None else ServerConfig()


def uvicorn_config(app: Litestar, host: str, port: int, *, log_level: str = "warning") -> uvicorn.Config:
    keep_alive_s = server_config(app).keep_alive_s
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        # uvloop and httptools roughly halve the gateway's own per-request cost.
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan="on",
        log_level=log_level,
        access_log=False,
        # Nothing in the gateway reads the client's address, so uvicorn's X-Forwarded-For
        # rewriting (an extra ASGI layer on every request) buys nothing.
        proxy_headers=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=keep_alive_s,
        # Said on every response, so clients can let an idle connection go before we close it.
        # uvicorn writes its `headers` from bytes encoded once: no work per request.
        headers=[("keep-alive", f"timeout={keep_alive_s}")],
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

"""An ASGI app under uvicorn in a daemon thread of the test, with its own event loop: for stand-ins
that a test inspects directly (counters, events) while the gateway or a client talks to them.

`serve_in_thread` binds its loopback port itself before the server starts, so no other process
can take the port in between."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import uvicorn


@contextlib.contextmanager
def running(config: uvicorn.Config, sockets: list[socket.socket] | None = None) -> Iterator[uvicorn.Server]:
    """Start `config`'s server (on `sockets` if given), wait until it listens, yield it; on exit
    stop it at once, even with requests still open."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server in the test's thread did not start")
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        server.force_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def serve_in_thread(app: Any, *, lifespan: Literal["on", "off"] = "off") -> Iterator[int]:
    """Serve an ASGI app on a loopback port of its own; yields the port. The thread has its own
    event loop, so sync and async tests alike can call the app."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="critical", lifespan=lifespan, timeout_graceful_shutdown=1)
    try:
        with running(config, [sock]):
            yield sock.getsockname()[1]
    finally:
        sock.close()

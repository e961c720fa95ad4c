"""An ASGI app under uvicorn in a daemon thread of the test, with its own event loop: for stand-ins
that a test inspects directly (counters, events) while the gateway or a client talks to them."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

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

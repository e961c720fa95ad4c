"""A client that leaves cancels its request's work (`cancel_on_disconnect`), wherever the app is:
waiting before its answer, or between the frames of a streamed one. Against real sockets, with
hypothesis choosing where the client leaves and how (a FIN or a reset).

The invariant: every request the client left ends at once (long before the app's own wait would),
and how it ends says why: a request whose body had arrived is cancelled with `client_left` in its
scope, and its clean-up can still await (a stream's frames, sent by `EventStream`, are closed
whether the cancellation found them waiting for their next frame or blocked in `send` on a client
that reads nothing); one whose body had not is told by `read_body` (ClientDisconnected), as
before. The server logs no error for either.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from http_server import ClientDisconnected, EventStream, ServerLimits, client_left, read_body, server_config
from tests.support.leaving import leave
from tests.support.processes import free_port
from tests.support.threaded_server import running

LIMITS = ServerLimits(body_timeout_s=60.0)
WAIT_S = 120.0  # the app's own wait: far past the deadline below
DEADLINE_S = 20.0


@dataclass
class Ended:
    how: str  # "cancelled", "disconnected", or "left open" (a stream's frames not closed in time)
    client_left: bool
    cleaned_up: bool  # an await in the clean-up completed


class WaitingApp:
    """/wait: reads the body, then waits. /stream: reads it, then answers with an EventStream of
    `x-frames` frames of `x-size` bytes (a large one blocks in `send` on a client that does not
    read), then waits. Each request's end is put in `ended`, under its `x-id` header."""

    def __init__(self) -> None:
        self.ended: dict[str, Ended] = {}
        self.yielded: dict[str, int] = {}  # frames each stream has sent

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        ident = headers["x-id"]
        try:
            await read_body(receive, headers, LIMITS)
        except ClientDisconnected:
            self.ended[ident] = Ended("disconnected", client_left(scope), cleaned_up=False)
            return
        if scope["path"] == "/stream":
            frames = self._frames(scope, ident, int(headers["x-frames"]), int(headers["x-size"]))
            try:
                await EventStream(frames, {})(scope, receive, send)
            finally:
                # Frames left for the garbage collector to close would be closed later, in a task
                # of their own, after the request they belonged to had ended.
                self.ended.setdefault(ident, Ended("left open", client_left(scope), cleaned_up=False))
            return
        try:
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # clean-up that awaits: the cancellation came once
            self.ended[ident] = Ended("cancelled", client_left(scope), cleaned_up=True)
            raise  # left for the server to end quietly

    async def _frames(
        self, scope: dict[str, Any], ident: str, count: int, size: int
    ) -> AsyncGenerator[bytes, None]:
        """Where the cancellation lands depends on where the response was: waiting here for the
        next frame, or in `send` (then the frames are closed at their `yield`)."""
        try:
            for _ in range(count):
                yield b"data: " + b"x" * size + b"\n\n"
                self.yielded[ident] = self.yielded.get(ident, 0) + 1
                await asyncio.sleep(0)  # the next frame a loop turn later, as from an upstream
            await asyncio.sleep(WAIT_S)
        finally:
            await asyncio.sleep(0)  # the clean-up awaits, however the frames were left
            self.ended.setdefault(ident, Ended("cancelled", client_left(scope), cleaned_up=True))


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[int, WaitingApp, Errors]]:
    app = WaitingApp()
    errors = Errors()
    logging.getLogger("uvicorn.error").addHandler(errors)
    port = free_port()
    config = server_config(
        app, "127.0.0.1", port, LIMITS, cancel_on_disconnect=True, lifespan="off", log_config=None
    )
    with running(config):
        yield port, app, errors
    logging.getLogger("uvicorn.error").removeHandler(errors)


_counter = iter(range(1_000_000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/wait", "/stream"]),
    body_sent=st.sampled_from(["all", "part"]),
    read_head=st.booleans(),
    reset=st.booleans(),
    frames=st.integers(1, 64),
    size=st.sampled_from([16, 262144]),
    linger=st.booleans(),
)
def test_a_client_leaving_ends_its_request_at_once_and_says_why(
    served: tuple[int, WaitingApp, Errors],
    path: str,
    body_sent: str,
    read_head: bool,
    reset: bool,
    frames: int,
    size: int,
    linger: bool,
) -> None:
    port, app, errors = served
    ident = str(next(_counter))
    body = b'{"x": 1}'
    head = (
        f"POST {path} HTTP/1.1\r\nhost: t\r\nx-id: {ident}\r\nx-frames: {frames}\r\nx-size: {size}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: large streams block
    sock.settimeout(DEADLINE_S)
    sock.connect(("127.0.0.1", port))
    sock.sendall(head.encode() + (body if body_sent == "all" else body[:3]))
    if read_head and path == "/stream" and body_sent == "all":
        assert sock.recv(1) == b"H"  # the response has begun: the client leaves mid-stream
    if linger and path == "/stream" and body_sent == "all":
        # Streaming: a while for a large stream to fill the socket buffers, so that the client's
        # leaving finds it blocked in `send` (were the machine too slow for that, it finds the
        # stream between frames: the invariant is the same).
        deadline = time.monotonic() + DEADLINE_S
        while not app.yielded.get(ident):
            assert time.monotonic() < deadline, "the stream never began"
            time.sleep(0.01)
        time.sleep(0.2)
    leave(sock, reset=reset)

    deadline = time.monotonic() + DEADLINE_S
    while ident not in app.ended:
        assert time.monotonic() < deadline, "a request whose client left went on"
        time.sleep(0.01)
    ended = app.ended[ident]
    if body_sent == "all":
        assert ended == Ended("cancelled", client_left=True, cleaned_up=True)
    else:
        assert ended.how == "disconnected" and not ended.client_left
    assert not errors.records, [r.getMessage() for r in errors.records]


def test_without_the_option_a_client_leaving_cancels_nothing() -> None:
    """The nodes' servers keep uvicorn's behaviour: their app watches for the disconnect itself."""
    app = WaitingApp()
    port = free_port()
    config = server_config(app, "127.0.0.1", port, LIMITS, lifespan="off", log_level="warning")
    with running(config), socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /wait HTTP/1.1\r\nhost: t\r\nx-id: kept\r\ncontent-length: 2\r\n\r\nok")
        time.sleep(0.2)
        sock.close()
        time.sleep(0.5)
        assert "kept" not in app.ended

"""A client that leaves cancels its request's work (`cancel_on_disconnect`), wherever the app is:
waiting before its answer, or between the frames of a streamed one. Against real sockets, with
hypothesis choosing where the client leaves and how (a FIN or a reset).

The invariant: every request the client left ends at once (long before the app's own wait would),
and how it ends says why: a request whose body had arrived is cancelled with `client_left` in its
scope, and its clean-up can still await; one whose body had not is told by `read_body`
(ClientDisconnected), as before. The server logs no error for either.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from http_server import ClientDisconnected, ServerLimits, client_left, read_body, server_config
from tests.support.processes import free_port
from tests.support.threaded_server import running

LIMITS = ServerLimits(body_timeout_s=60.0)
WAIT_S = 120.0  # the app's own wait: far past the deadline below
DEADLINE_S = 20.0


@dataclass
class Ended:
    how: str  # "cancelled" or "disconnected"
    client_left: bool
    cleaned_up: bool  # an await in the clean-up completed


class WaitingApp:
    """/wait: reads the body, then waits; /stream: reads it, sends a head and one frame, then
    waits. Each request's end is put in `ended`, under its `x-id` header."""

    def __init__(self) -> None:
        self.ended: dict[str, Ended] = {}

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
        try:
            if scope["path"] == "/stream":
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # clean-up that awaits: the cancellation came once
            self.ended[ident] = Ended("cancelled", client_left(scope), cleaned_up=True)
            raise  # left for the server to end quietly


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
)
def test_a_client_leaving_ends_its_request_at_once_and_says_why(
    served: tuple[int, WaitingApp, Errors], path: str, body_sent: str, read_head: bool, reset: bool
) -> None:
    port, app, errors = served
    ident = str(next(_counter))
    body = b'{"x": 1}'
    head = f"POST {path} HTTP/1.1\r\nhost: t\r\nx-id: {ident}\r\ncontent-length: {len(body)}\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    sock.sendall(head.encode() + (body if body_sent == "all" else body[:3]))
    if read_head and path == "/stream" and body_sent == "all":
        assert sock.recv(1) == b"H"  # the response has begun: the client leaves mid-stream
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()

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

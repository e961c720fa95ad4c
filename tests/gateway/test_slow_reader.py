"""A client that reads one byte a second holds back the upstream, not the gateway's memory.

The chain that bounds it: the gateway's server (uvicorn) makes a send wait while its transport
holds more than its high-water mark for a slow client; the relay asks the upstream for the next
chunk only after that send; the HTTP client (gateway/http/) pauses reading the upstream's socket
once 256 KiB wait unread; then the kernel's socket buffers fill and the upstream's own send
blocks. Nothing between the two sockets queues without bound.

The upstream here is an endless SSE stream as fast as it can write, served by uvicorn on a
thread; it counts the bytes its sends got rid of. A gateway that buffered for the slow client
would let that count grow for as long as the stream lasts (hundreds of MB a minute on loopback);
bounded, it stops at the socket buffers plus the gateway's two high-water marks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import GLOBAL_KEY, RunningGateway, gateway_config, run_gateway
from tests.support.stream_node import answer_probe, begin_stream, one_node_regions, serve_node

# Kernel buffers on loopback autotune to a few MB per socket (net.ipv4.tcp_wmem/rmem maxima: 4 MB
# and 6 MB by default); four of them lie between the upstream and the client. Unbounded buffering
# passes this within a second or two.
BOUND_BYTES = 48 * 1024 * 1024
_FRAME = (
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-slow",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "meridian-small",
            "choices": [{"index": 0, "delta": {"content": "x" * 1000}, "finish_reason": None}],
        }
    ).encode()
    + b"\n\n"
)


class EndlessUpstream:
    """/ready, /load and a chat stream that never ends; `sent` counts the bytes its sends took."""

    def __init__(self) -> None:
        self.sent = 0
        self.streaming = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or await answer_probe(scope, send):
            return
        await begin_stream(receive, send)
        self.streaming.set()
        gone = asyncio.ensure_future(receive())  # http.disconnect once the gateway lets go
        frames = _FRAME * 16
        try:
            while not gone.done():  # uvicorn drops sends after a disconnect: stop counting then
                await send({"type": "http.response.body", "body": frames, "more_body": True})
                self.sent += len(frames)
                # A dropped send returns without suspending: without a turn of the loop, `gone`
                # never completed and this loop spun on, holding the GIL for the rest of the run.
                await asyncio.sleep(0)
        finally:
            gone.cancel()


@pytest.fixture
def upstream() -> Iterator[tuple[str, EndlessUpstream]]:
    app = EndlessUpstream()
    with serve_node(app) as url:
        yield url, app


@pytest.fixture
def gateway(upstream: tuple[str, EndlessUpstream], tmp_path: Path) -> Iterator[RunningGateway]:
    url, _ = upstream
    regions = one_node_regions(tmp_path, "endless", url)
    with run_gateway(gateway_config(regions)) as running:
        yield running


def test_a_client_reading_one_byte_a_second_stalls_the_upstream_not_the_gateway(
    gateway: RunningGateway, upstream: tuple[str, EndlessUpstream]
) -> None:
    _, endless = upstream
    port = int(gateway.url.rsplit(":", 1)[1])
    body = json.dumps(
        {"model": "meridian-small", "messages": [{"role": "user", "content": "go"}], "stream": True}
    ).encode()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    client.settimeout(10)
    client.connect(("127.0.0.1", port))
    try:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
            % (GLOBAL_KEY.encode(), len(body), body)
        )
        assert client.recv(1).startswith(b"H")  # the stream's answer has begun
        assert endless.streaming.wait(30)
        # One byte a second, until the upstream has been held still for 2 s (its sends block).
        last, still_since = endless.sent, time.monotonic()
        deadline = time.monotonic() + 60
        while time.monotonic() - still_since < 2.0:
            assert time.monotonic() < deadline, f"the upstream never stalled: {endless.sent} bytes sent"
            assert endless.sent < BOUND_BYTES, (
                f"{endless.sent} bytes left the upstream for a client that read a few"
            )
            time.sleep(1.0)
            assert client.recv(1)
            if endless.sent - last > 64 * 1024:
                last, still_since = endless.sent, time.monotonic()
        assert endless.sent < BOUND_BYTES
    finally:
        client.close()

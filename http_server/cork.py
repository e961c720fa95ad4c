"""A transport that sends what one event-loop turn wrote as one write.

uvicorn writes a response's head and each body message to the socket as it comes: a small
non-streamed answer costs two `send()` calls, and a relayed stream one per SSE frame, although a
proxy that has just read several frames from its upstream produces them all in the same turn of
the loop (the relay never waits between them). A `send()` costs about as much as the framing of
a frame (~10 µs on the machines the gateway benchmark ran on), so the writes of one turn are
joined and written once when the turn ends (`call_soon`), the way a corked TCP socket (or Node's
`cork()`/`uncork()` around a tick) batches them.

What it changes, and what it does not:
- the bytes and their order are the same; they leave at the end of the current loop turn, which
  adds no wait a client could measure;
- flow control still works: the joined write reaches the real transport within the turn, which
  pauses the protocol past its high-water mark as before, and what is held here is at most one
  turn's output (what the app produced from data already in memory);
- close() and write_eof() send what is held first, so nothing written before them is lost.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CorkedTransport:
    """Wraps the connection's transport; every other attribute is the real transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        """Send what this turn wrote (a no-op once sent, or on a closing transport)."""
        if not self._held:
            return
        held = self._held
        self._held = []
        if not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(data) for data in self._held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

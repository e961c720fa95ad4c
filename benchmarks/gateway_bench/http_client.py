"""A minimal keep-alive HTTP/1.1 client for the load generator: one connection, one request at a time.

Why not httpx: on this benchmark's 2-core machine httpx spends ~0.3 ms of CPU per request, about
what the systems under test spend, so the client would become the bottleneck it must not be. This
client writes pre-built request bytes and parses only what a load generator needs (status,
Content-Length or chunked framing), at a few microseconds per request.

Time to first byte is when the first non-empty body chunk arrives: for an SSE stream, the first
`data:` event, not merely the response headers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


class HttpProtocolError(Exception):
    """The server's answer was not HTTP/1.1 this client can parse."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    latency_s: float  # request written -> last body byte read
    ttfb_s: float  # request written -> first non-empty body chunk read


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The bytes of one POST; built once per load phase and written as they are for every request."""
    lines = [f"POST {path} HTTP/1.1", f"host: {host}:{port}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> Reply:
        """Send `raw`, read the whole answer. Any exception leaves the connection closed."""
        try:
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
            assert self._reader is not None
            started = time.perf_counter()
            self._writer.write(raw)
            return await self._read_reply(self._reader, started)
        except BaseException:
            self.close()
            raise

    async def _read_reply(self, reader: asyncio.StreamReader, started: float) -> Reply:
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, _, header_block = head.partition(b"\r\n")
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
            raise HttpProtocolError(f"bad status line {status_line[:40]!r}")
        status = int(status_line[9:12])
        length: int | None = None
        chunked, keep_alive = False, True
        for line in header_block.split(b"\r\n"):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep_alive = b"close" not in value.lower()
        if chunked:
            body, first = await _read_chunked(reader)
        elif length is not None:
            body = await reader.readexactly(length)
            first = time.perf_counter()
        else:
            body = await reader.read()  # no framing: the body ends when the server closes
            first, keep_alive = time.perf_counter(), False
        done = time.perf_counter()
        if not keep_alive:
            self.close()
        return Reply(status=status, body=body, latency_s=done - started, ttfb_s=(first or done) - started)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _read_chunked(reader: asyncio.StreamReader) -> tuple[bytes, float | None]:
    """A chunked body and when its first non-empty chunk arrived (trailers are not expected)."""
    parts: list[bytes] = []
    first: float | None = None
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts), first
        data = await reader.readexactly(size + 2)
        if first is None:
            first = time.perf_counter()
        parts.append(data[:-2])

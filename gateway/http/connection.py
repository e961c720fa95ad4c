"""One keep-alive HTTP/1.1 connection (an asyncio protocol feeding httptools) and the values it reads."""

from __future__ import annotations

import asyncio
import collections
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlsplit

import httptools

from gateway.http.errors import ReadError, ReadTimeout, RemoteProtocolError, TransportError

if TYPE_CHECKING:
    from gateway.http.pool import ConnectionPool


class Origin(NamedTuple):
    scheme: str  # "http" or "https"
    host: str
    port: int


def split_url(url: str) -> tuple[Origin, str, str]:
    """(origin, the Host header's value, the path prefix) of a base URL like http://h:8000/x."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return Origin(parts.scheme, parts.hostname, port), parts.netloc.rpartition("@")[2], parts.path.rstrip("/")


Headers = list[tuple[bytes, bytes]]  # (lower-case name, value) in the order received


@functools.lru_cache(maxsize=64)  # a server says the same thing in every response: parse it once
def keep_alive_timeout(value: bytes) -> float | None:
    """N of a `Keep-Alive: timeout=N, max=M` header's value, in seconds; None if it has none."""
    for param in value.split(b","):
        name, _, number = param.partition(b"=")
        if name.strip().lower() == b"timeout":
            try:
                seconds = float(number.strip().strip(b'"'))
            except ValueError:
                return None
            return seconds if math.isfinite(seconds) and seconds >= 0 else None
    return None


def idle_expiry(advertised_s: float, own_s: float) -> float:
    """How long to keep a connection idle whose server said `Keep-Alive: timeout=advertised_s`.

    The server's timer starts when it has written the response's end, ours when we have read it,
    and a reused request takes a moment to reach it: a margin of a second (half of a shorter
    timeout) keeps us clear of its close. Never longer than our own expiry.
    """
    # Branches rather than `advertised_s - min(1, advertised_s / 2)`: that rounds above half of a
    # tiny timeout.
    return min(own_s, advertised_s - 1.0 if advertised_s >= 2.0 else advertised_s / 2)


def _header(headers: Headers, name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


@dataclass(slots=True)
class Response:
    """A response read to its end."""

    status: int
    headers: Headers
    body: bytes

    def header(self, name: bytes) -> str | None:
        """The first value of header `name` (lower case), if the response has it."""
        return _header(self.headers, name)


# Streams pause the socket when this much body is waiting for a slow reader, and resume once the
# reader took it: a stalled client then holds back the node instead of the gateway's memory.
_HIGH_WATER = 256 * 1024


class Connection(asyncio.Protocol):
    """One keep-alive connection and the response being read on it. httptools calls the `on_*`
    methods from inside `feed_data`."""

    def __init__(self, pool: ConnectionPool, origin: Origin) -> None:
        self._pool = pool
        self.origin = origin
        self._loop = pool.loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False  # it has served a response before this one
        self.idle_since = 0.0  # when the last response ended (the server's idle timer started)
        self.expires_at = 0.0  # idle in the pool until then
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._timeout_s = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: Headers = []
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.keep_alive_s: float | None = None  # the response's `Keep-Alive: timeout=N`
        self.received = False  # any byte of this response arrived
        self._framed = False  # Content-Length or chunked: the body does not end at EOF
        self._error: TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        if not self._busy:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RemoteProtocolError(f"invalid HTTP response: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close our side too: HTTP/1.1 has no use for a half-open connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._busy and not self.complete:
            if self.headers_done and not self._framed:
                self.complete = True  # a body without framing ends when the connection does
                self._wake()
            else:
                self._fail(ReadError(f"the server closed the connection ({exc or 'EOF'})"))
        self._pool.forget(self)

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in (b"content-length", b"transfer-encoding"):
            self._framed = True
        elif name == b"keep-alive":
            self.keep_alive_s = keep_alive_timeout(value)
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        # Not when the caller hands the connection back: a slow reader may release it long
        # after the server started counting.
        self.idle_since = self._loop.time()
        self._wake()

    # used by the pool and the caller

    def send(self, raw: bytes) -> None:
        if self.closed or self._transport is None or self._transport.is_closing():
            raise ReadError("the connection was closed before the request was sent")
        self._reset()
        self._busy = True
        self._transport.write(raw)

    def header(self, name: bytes) -> str | None:
        """The first value of header `name` (lower case), if the response has it."""
        return _header(self.headers, name)

    async def wait_headers(self, timeout_s: float) -> None:
        while not self.headers_done:
            await self._wait(timeout_s)

    async def next_chunk(self, timeout_s: float) -> bytes | None:
        """The body bytes (de-chunked) that arrived since the last call, waiting up to `timeout_s`
        for some; None once the body is complete."""
        while not self._body:
            if self.complete:
                return None
            await self._wait(timeout_s)
        body = self._body
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def read_body(self, timeout_s: float) -> bytes:
        """The rest of the body; `timeout_s` bounds each wait for more bytes, not the total."""
        while not self.complete:
            if self._paused and self._transport is not None:
                self._paused = False  # the whole body is wanted: the high-water mark is moot
                self._transport.resume_reading()
            await self._wait(timeout_s)
        body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body.clear()
        self._buffered = 0
        return body

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self._error is None

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def finished(self) -> None:
        """The caller is done with the response (read or not)."""
        self._busy = False
        self.reused = True

    async def _wait(self, timeout_s: float) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._loop.create_future()
        # One timer per connection, moved only when it fires early: a stream waits once per
        # chunk, and arming and cancelling a timer for each wait costs more than the wait.
        self._deadline = deadline = self._loop.time() + timeout_s
        self._timeout_s = timeout_s
        if self._timer is not None and self._timer.when() > deadline:
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._on_timer)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody is waiting: the next wait arms it again
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._on_timer)
        else:
            waiter.set_exception(ReadTimeout(f"no response bytes for {self._timeout_s:g}s"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: TransportError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

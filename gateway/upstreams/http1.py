"""A lean pooled HTTP/1.1 client for node and provider traffic: asyncio protocol + httptools' parser.

Why not httpx: a request through httpx/httpcore costs the gateway about as much CPU as everything
else it does per request (its profile is mostly httpcore's connection-pool bookkeeping, h11 and
the anyio stream layers), and httpcore does not survive the keep-alive race (below). Nodes and
providers speak one dialect — HTTP/1.1, `Content-Length` JSON or chunked SSE, over TCP or TLS —
so this client does only that: one `asyncio.Protocol` per connection feeding llhttp (through
httptools), which de-chunks the body and says whether the connection may be kept.

Rules the callers rely on:
- Connections are pooled per origin (scheme, host, port), newest idle first, at most
  `max_connections` open per origin (more requests wait, up to the connect timeout) and at most
  `max_idle` kept idle; an idle one is dropped as soon as the server closes it, and never reused
  once it may be near the server's own idle timeout: after `idle_expiry_s`, or sooner when the
  response said `Keep-Alive: timeout=N` (then safely before N, whatever N the server runs with).
  Idle time counts from when the response ended, not from when the caller finished reading it.
- A connection goes back to the pool only if its response was read to the end and both sides
  allow keep-alive. Releasing a stream's connection early closes it: that is how a node learns
  its client went away and frees the sequence's KV blocks.
- A request sent on a reused connection that the server closed before answering a single byte is
  sent once more, on a new connection: the server closed it as idle just as we reused it (the
  keep-alive race), so it never saw the request. The caller never sees that first attempt, so it
  is never held against the server.
- Every wait is bounded: connecting by the connect timeout, each wait for response bytes by the
  read timeout (for a stream, the idle time allowed between two chunks).
- https verifies the server's certificate and host name (SNI set) against the system's CA store
  and certifi's bundle (`default_ssl_context`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import math
import os
import ssl
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import certifi
import httptools


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


class TransportError(Exception):
    """The exchange failed below HTTP: no usable response came back."""


class ConnectError(TransportError):
    """The connection could not be opened (refused, unreachable, TLS failed)."""


class ReadError(TransportError):
    """The connection ended before the whole response arrived."""


class RemoteProtocolError(TransportError):
    """The server answered something that is not HTTP/1.1."""


class Timeout(TransportError):
    """A bounded wait ran out."""


class ConnectTimeout(Timeout):
    pass


class ReadTimeout(Timeout):
    pass


class PoolTimeout(Timeout):
    """Every connection the pool may open to this origin stayed busy for the connect timeout."""


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


class ConnectionPool:
    """Keep-alive connections per origin; one pool serves every node (owned by the app)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        max_connections: int = 1024,
        max_idle: int = 128,
        # For servers that do not say how long they keep an idle connection: below uvicorn's
        # 5 s default. Servers that say `Keep-Alive: timeout=N` get N minus a margin (at most
        # this); the retry covers what is left of the race.
        idle_expiry_s: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        assert max_connections >= 1 and max_idle >= 0
        self.connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._max_idle = max_idle
        self._idle_expiry_s = idle_expiry_s
        self._ssl = ssl_context  # made on the first https connection when not given
        self._idle: dict[Origin, list[Connection]] = {}
        self._open: dict[Origin, int] = collections.defaultdict(int)
        self._waiters: dict[Origin, collections.deque[asyncio.Future[None]]] = collections.defaultdict(
            collections.deque
        )
        self._connections: set[Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    async def request(self, origin: Origin, raw: bytes, *, timeout_s: float) -> Response:
        """Send `raw` (a whole request) and read the whole response."""
        connection = await self.open(origin, raw, timeout_s=timeout_s)
        try:
            body = await connection.read_body(timeout_s)
        finally:
            self.release(connection)
        return Response(connection.status, connection.headers, body)

    async def open(self, origin: Origin, raw: bytes, *, timeout_s: float) -> Connection:
        """Send `raw`; returns once the response headers are in. Read the body with
        `next_chunk` or `read_body`, then hand the connection back with `release` whatever
        happened: released before the body's end, it is closed."""
        connection = await self._acquire(origin)
        try:
            connection.send(raw)
            await connection.wait_headers(timeout_s)
            return connection
        except ReadError:
            raced = connection.reused and not connection.received
            self.release(connection)
            if not raced:
                raise
        except BaseException:
            self.release(connection)
            raise
        # The keep-alive race (see the module docstring): once more, on a new connection.
        connection = await self._acquire(origin, fresh=True)
        try:
            connection.send(raw)
            await connection.wait_headers(timeout_s)
        except BaseException:
            self.release(connection)
            raise
        return connection

    async def _acquire(self, origin: Origin, *, fresh: bool = False) -> Connection:
        deadline: float | None = None
        while True:
            if not fresh:
                connection = self._take_idle(origin)
                if connection is not None:
                    return connection
            if self._open[origin] < self._max_connections:
                return await self._connect(origin)
            now = self.loop.time()
            deadline = deadline or now + self.connect_timeout_s
            if now >= deadline:
                raise PoolTimeout(f"all {self._max_connections} connections to {origin.host} stayed busy")
            waiter = self.loop.create_future()
            self._waiters[origin].append(waiter)
            timer = self.loop.call_later(deadline - now, _release_waiter, waiter)
            try:
                await waiter
            except BaseException:
                if waiter.cancelled():
                    with contextlib.suppress(ValueError):
                        self._waiters[origin].remove(waiter)
                else:
                    self._wake_waiter(origin)  # woken, then cancelled: the slot goes to the next
                raise
            finally:
                timer.cancel()

    def _take_idle(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        now = self.loop.time()
        while idle:
            connection = idle.pop()  # newest first: the least likely to be closed by the server
            if not connection.closed and connection.expires_at > now:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin) -> Connection:
        self._open[origin] += 1
        secure = origin.scheme == "https"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await self.loop.create_connection(
                    lambda: Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=self._ssl_context() if secure else None,
                    server_hostname=origin.host if secure else None,
                )
        except TimeoutError:
            self._slot_freed(origin)
            raise ConnectTimeout(
                f"connecting to {origin.host}:{origin.port} took over {self.connect_timeout_s:g}s"
            ) from None
        except OSError as exc:
            self._slot_freed(origin)
            raise ConnectError(f"cannot connect to {origin.host}:{origin.port}: {exc}") from None
        except BaseException:
            self._slot_freed(origin)
            raise
        self._connections.add(connection)
        return connection

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = default_ssl_context()  # loads the CA stores: once, not per connection
        return self._ssl

    def release(self, connection: Connection) -> None:
        """Back to the pool if it may carry another request, else closed."""
        keep = connection.reusable()
        connection.finished()
        if not keep:
            connection.close()
            return
        expiry = self._idle_expiry_s
        if connection.keep_alive_s is not None:
            expiry = idle_expiry(connection.keep_alive_s, expiry)
        connection.expires_at = connection.idle_since + expiry
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) >= self._max_idle:
            connection.close()
            return
        idle.append(connection)
        self._wake_waiter(connection.origin)

    def forget(self, connection: Connection) -> None:
        """A connection closed (either side): its slot is free."""
        if connection not in self._connections:
            return
        self._connections.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)
        self._slot_freed(connection.origin)

    def _slot_freed(self, origin: Origin) -> None:
        self._open[origin] -= 1
        self._wake_waiter(origin)

    def _wake_waiter(self, origin: Origin) -> None:
        waiters = self._waiters.get(origin)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for connection in list(self._connections):
            connection.close()
        self._idle.clear()
        # Let the transports run their close callbacks before the loop goes away.
        await asyncio.sleep(0)


def default_ssl_context() -> ssl.SSLContext:
    """Certificate and host name checks against the system's CA store (which honours
    SSL_CERT_FILE and SSL_CERT_DIR) and, unless those are set, certifi's bundle too: public APIs
    verify as they did under httpx (certifi) even on a host without a CA store, and a node with a
    certificate from a private CA verifies once that CA is in the system store."""
    context = ssl.create_default_context()
    if not (os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR")):
        context.load_verify_locations(certifi.where())
    context.set_alpn_protocols(["http/1.1"])
    return context


def _release_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)  # the acquiring loop sees its deadline passed

"""The pool of keep-alive connections per origin (the rules are in the package's docstring)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import ssl
from collections.abc import Mapping

import certifi

from gateway.http.connection import Connection, Origin, Response, idle_expiry, split_url
from gateway.http.errors import ConnectError, ConnectTimeout, PoolTimeout, ReadError


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

    async def get(self, url: str, *, headers: Mapping[str, str], timeout_s: float) -> Response:
        """GET `url` (http or https) and read the whole response. ValueError for a URL that is
        not http(s); a TransportError when no usable response came back."""
        origin, host, path = split_url(url)
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        raw = f"GET {path or '/'} HTTP/1.1\r\nhost: {host}\r\n{lines}\r\n".encode("latin-1")
        return await self.request(origin, raw, timeout_s=timeout_s)

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

"""A TCP proxy that plays a server whose idle-connection close always wins the keep-alive race.

A server closes a connection that stayed idle for its keep-alive timeout; a client that writes
its next request on that connection at the same moment loses the request (the server never read
it). Real servers make that a matter of milliseconds; this proxy makes it certain: when a request
(bytes starting with one of `methods`) arrives on a connection that has carried a response and
has been idle for at least `close_after_s`, the proxy closes the connection without forwarding a
byte, as the server's close would have. `close_after_s = 0` makes every reused connection lose.

Everything else goes through to the target unchanged, reconnecting to it when the target had
closed its side of an idle connection, so the target's own keep-alive never shows. It runs in a
thread with its own event loop, so sync tests, async tests and gateways in threads can all use it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class _Link:
    """One client connection's state."""

    last_response_byte_at: float | None = None  # None: no response yet (a fresh connection)
    pending: bool = False  # request bytes went upstream and no response byte came back since
    upstream: asyncio.StreamWriter | None = None


@dataclass
class IdleCloser:
    target_port: int
    close_after_s: float
    methods: tuple[bytes, ...] = (b"POST ",)
    target_host: str = "127.0.0.1"
    raced: int = 0  # requests dropped with their connection, never forwarded
    port: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        link = _Link()
        self._track(asyncio.current_task())
        try:
            while data := await reader.read(65536):
                idle_since = link.last_response_byte_at
                if (
                    not link.pending
                    and idle_since is not None
                    and data.startswith(self.methods)
                    and loop.time() - idle_since >= self.close_after_s
                ):
                    self.raced += 1
                    return  # closed as idle just as the request came: never answered
                if link.upstream is None or link.upstream.is_closing():
                    up_reader, link.upstream = await asyncio.open_connection(
                        self.target_host, self.target_port
                    )
                    self._track(asyncio.create_task(self._pump(up_reader, writer, link)))
                link.pending = True
                link.upstream.write(data)
                await link.upstream.drain()
        except ConnectionError:
            pass
        finally:
            if link.upstream is not None:
                link.upstream.close()
            writer.close()

    def _track(self, task: asyncio.Task[None] | None) -> None:
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, upstream: asyncio.StreamReader, client: asyncio.StreamWriter, link: _Link) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await upstream.read(65536):
                link.pending = False
                link.last_response_byte_at = loop.time()
                client.write(data)
                await client.drain()
        except ConnectionError:
            pass
        if link.pending:
            client.close()  # the target went away with a request in hand: say so
        elif link.upstream is not None:
            link.upstream.close()  # the target closed an idle connection: reconnect on the next request


@contextmanager
def idle_closer(target_port: int, *, close_after_s: float) -> Iterator[IdleCloser]:
    """An IdleCloser in front of 127.0.0.1:`target_port`, on a free loopback port."""
    proxy = IdleCloser(target_port, close_after_s)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    servers: list[asyncio.Server] = []

    async def serve() -> None:
        server = await asyncio.start_server(proxy._handle, "127.0.0.1", 0)
        servers.append(server)
        proxy.port = server.sockets[0].getsockname()[1]
        started.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve())
        loop.run_forever()

    thread = threading.Thread(target=run, name="idle-closer", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the idle-closing proxy did not start")
    try:
        yield proxy
    finally:

        async def stop() -> None:
            for server in servers:
                server.close()
            tasks = list(proxy._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()

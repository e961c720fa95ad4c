"""The node HTTP/1.1 client against a real server on 127.0.0.1: a raw asyncio server whose answers
each test scripts byte by byte, so framing, keep-alive and closing are exactly what the test says.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import uvloop
from hypothesis import given
from hypothesis import strategies as st

from gateway.http import (
    ConnectError,
    ConnectionPool,
    Origin,
    PoolTimeout,
    ReadError,
    ReadTimeout,
    RemoteProtocolError,
    idle_expiry,
    keep_alive_timeout,
    split_url,
)

JSON_OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def request(path: str = "/x", body: bytes = b"{}") -> bytes:
    return f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def eventually(condition: Callable[[], bool], timeout_s: float = 2.0) -> bool:
    """Whether `condition` holds within `timeout_s` (the other side needs a few loop turns)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


@pytest.fixture(params=["asyncio", "uvloop"], scope="module")
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Every test on both loops: the gateway serves on uvloop, whose transports differ in detail."""
    return uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()


@dataclass
class Exchange:
    """What the server sees of one request: which connection (0, 1, ...) and its index on it."""

    connection: int
    index: int
    request: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


Answer = Callable[[Exchange], Awaitable[None]]


@dataclass
class Server:
    answer: Answer
    exchanges: list[Exchange] = field(default_factory=list)
    connections: int = 0
    closed: list[int] = field(default_factory=list)  # connections that ended (EOF seen)
    origin: Origin | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        index = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                exchange = Exchange(number, index, head + body, reader, writer)
                self.exchanges.append(exchange)
                index += 1
                await self.answer(exchange)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.append(number)
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[Server]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> Server:
        server = Server(answer)
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        servers.append(listening)
        port = listening.sockets[0].getsockname()[1]
        server.origin = Origin("http", "127.0.0.1", port)
        return server

    yield start
    for listening in servers:
        listening.close()


async def reply(exchange: Exchange, raw: bytes) -> None:
    exchange.writer.write(raw)
    await exchange.writer.drain()


async def ok(exchange: Exchange) -> None:
    await reply(exchange, JSON_OK)


@pytest.fixture
async def pool() -> AsyncIterator[ConnectionPool]:
    pool = ConnectionPool(connect_timeout_s=2.0)
    yield pool
    await pool.aclose()


def test_split_url_gives_origin_host_header_and_path_prefix() -> None:
    assert split_url("http://127.0.0.1:8000") == (Origin("http", "127.0.0.1", 8000), "127.0.0.1:8000", "")
    assert split_url("https://node.eu/api/") == (Origin("https", "node.eu", 443), "node.eu", "/api")
    with pytest.raises(ValueError):
        split_url("ftp://node")


async def test_keep_alive_reuses_one_connection_for_sequential_requests(serve, pool) -> None:
    server = await serve(ok)
    for _ in range(5):
        response = await pool.request(server.origin, request(), timeout_s=2)
        assert (response.status, response.body) == (200, b'{"ok": true}')
        assert response.header(b"content-type") == "application/json"
    assert server.connections == 1
    assert [e.index for e in server.exchanges] == [0, 1, 2, 3, 4]


async def test_concurrent_requests_open_connections_up_to_the_bound_then_wait(serve) -> None:
    release = asyncio.Event()

    async def slow(exchange: Exchange) -> None:
        await release.wait()
        await ok(exchange)

    server = await serve(slow)
    pool = ConnectionPool(connect_timeout_s=2.0, max_connections=2)
    try:
        calls = [asyncio.create_task(pool.request(server.origin, request(), timeout_s=5)) for _ in range(5)]
        await asyncio.sleep(0.2)
        assert server.connections == 2 and len(server.exchanges) == 2  # three wait for a slot
        release.set()
        responses = await asyncio.gather(*calls)
        assert all(r.status == 200 for r in responses)
        assert server.connections == 2  # the waiting three went over the two kept connections
    finally:
        await pool.aclose()


async def test_a_full_pool_times_out_after_the_connect_timeout(serve) -> None:
    async def never(exchange: Exchange) -> None:
        await asyncio.sleep(10)

    server = await serve(never)
    pool = ConnectionPool(connect_timeout_s=0.3, max_connections=1)
    try:
        held = asyncio.create_task(pool.request(server.origin, request(), timeout_s=10))
        await asyncio.sleep(0.1)
        with pytest.raises(PoolTimeout):
            await pool.request(server.origin, request(), timeout_s=10)
        held.cancel()
    finally:
        await pool.aclose()


async def test_chunked_body_is_dechunked_piece_by_piece(serve, pool) -> None:
    async def chunked(exchange: Exchange) -> None:
        await reply(exchange, CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await asyncio.sleep(0.02)
        await reply(exchange, chunk(b"data: 2\n\n") + b"0\r\n\r\n")

    server = await serve(chunked)
    connection = await pool.open(server.origin, request(), timeout_s=2)
    pieces = []
    while (piece := await connection.next_chunk(2)) is not None:
        pieces.append(piece)
    pool.release(connection)
    assert pieces == [b"data: 1\n\n", b"data: 2\n\n"]
    # Read to its end on a keep-alive connection: the next request reuses it.
    assert (await pool.request(server.origin, request(), timeout_s=2)).body == b"data: 1\n\ndata: 2\n\n"
    assert server.connections == 1


async def test_content_length_body_split_over_writes_is_read_whole(serve, pool) -> None:
    body = b"x" * 1_000_000  # past the streams' high-water mark: a whole body is read regardless

    async def split(exchange: Exchange) -> None:
        await reply(exchange, b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n" + body[:1000])
        await asyncio.sleep(0.02)
        await reply(exchange, body[1000:])

    server = await serve(split)
    response = await pool.request(server.origin, request(), timeout_s=2)
    assert response.body == body


async def test_a_body_without_framing_ends_when_the_server_closes(serve, pool) -> None:
    async def unframed(exchange: Exchange) -> None:
        await reply(exchange, b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        exchange.writer.close()

    server = await serve(unframed)
    assert (await pool.request(server.origin, request(), timeout_s=2)).body == b"all of it"
    await pool.request(server.origin, request(), timeout_s=2)
    assert server.connections == 2  # never reused


async def test_connection_close_header_is_honoured(serve, pool) -> None:
    async def closing(exchange: Exchange) -> None:
        await reply(exchange, b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok")

    server = await serve(closing)
    for _ in range(3):
        assert (await pool.request(server.origin, request(), timeout_s=2)).body == b"ok"
    assert server.connections == 3


async def test_an_idle_connection_the_server_closed_is_not_reused(serve, pool) -> None:
    async def answer_then_close(exchange: Exchange) -> None:
        await ok(exchange)
        await asyncio.sleep(0.05)
        exchange.writer.close()  # the server's keep-alive timeout, while the client is idle

    server = await serve(answer_then_close)
    await pool.request(server.origin, request(), timeout_s=2)
    await asyncio.sleep(0.2)
    assert (await pool.request(server.origin, request(), timeout_s=2)).status == 200
    assert server.connections == 2
    assert len(server.exchanges) == 2  # nothing was sent on the closed connection


async def test_a_connection_idle_past_the_expiry_is_replaced(serve) -> None:
    server = await serve(ok)
    pool = ConnectionPool(connect_timeout_s=2.0, idle_expiry_s=0.1)
    try:
        await pool.request(server.origin, request(), timeout_s=2)
        await pool.request(server.origin, request(), timeout_s=2)
        assert server.connections == 1
        await asyncio.sleep(0.3)  # the server would still take it; we no longer trust it
        await pool.request(server.origin, request(), timeout_s=2)
        assert server.connections == 2
        assert await eventually(lambda: server.closed == [0])  # the expired one was closed, not leaked
    finally:
        await pool.aclose()


async def test_keep_alive_race_is_retried_once_on_a_new_connection(serve, pool) -> None:
    async def drop_second_on_each_connection(exchange: Exchange) -> None:
        if exchange.index == 1:
            exchange.writer.close()  # closed as idle just as the request came: never answered
            return
        await ok(exchange)

    server = await serve(drop_second_on_each_connection)
    await pool.request(server.origin, request(), timeout_s=2)
    response = await pool.request(server.origin, request(), timeout_s=2)
    assert response.status == 200
    assert [(e.connection, e.index) for e in server.exchanges] == [(0, 0), (0, 1), (1, 0)]


async def test_a_new_connection_closed_before_an_answer_is_not_retried(serve, pool) -> None:
    async def drop(exchange: Exchange) -> None:
        exchange.writer.close()

    server = await serve(drop)
    with pytest.raises(ReadError):
        await pool.request(server.origin, request(), timeout_s=2)
    assert len(server.exchanges) == 1  # the server may have acted on it: never sent twice


async def test_a_connection_closed_mid_body_is_a_read_error_and_not_retried(serve, pool) -> None:
    async def half(exchange: Exchange) -> None:
        if exchange.index == 0:
            await ok(exchange)
            return
        await reply(exchange, b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        exchange.writer.close()

    server = await serve(half)
    await pool.request(server.origin, request(), timeout_s=2)
    with pytest.raises(ReadError):
        await pool.request(server.origin, request(), timeout_s=2)
    assert len(server.exchanges) == 2


async def test_no_answer_within_the_read_timeout_is_a_read_timeout(serve, pool) -> None:
    async def silent(exchange: Exchange) -> None:
        await asyncio.sleep(5)

    server = await serve(silent)
    started = asyncio.get_running_loop().time()
    with pytest.raises(ReadTimeout):
        await pool.request(server.origin, request(), timeout_s=0.2)
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_a_stream_that_stalls_between_chunks_times_out(serve, pool) -> None:
    async def stall(exchange: Exchange) -> None:
        await reply(exchange, CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await asyncio.sleep(5)

    server = await serve(stall)
    connection = await pool.open(server.origin, request(), timeout_s=0.2)
    try:
        assert await connection.next_chunk(0.2) == b"data: 1\n\n"
        with pytest.raises(ReadTimeout):
            await connection.next_chunk(0.2)
    finally:
        pool.release(connection)


async def test_a_refused_connection_is_a_connect_error(pool) -> None:
    listening = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    listening.close()
    await listening.wait_closed()
    with pytest.raises(ConnectError):
        await pool.request(Origin("http", "127.0.0.1", port), request(), timeout_s=1)


async def test_garbage_instead_of_http_is_a_protocol_error(serve, pool) -> None:
    async def garbage(exchange: Exchange) -> None:
        await reply(exchange, b"SSH-2.0-OpenSSH\r\n\r\n")

    server = await serve(garbage)
    with pytest.raises(RemoteProtocolError):
        await pool.request(server.origin, request(), timeout_s=1)


async def test_leaving_a_stream_early_closes_its_connection(serve, pool) -> None:
    async def endless(exchange: Exchange) -> None:
        await reply(exchange, CHUNKED_HEAD)
        while True:  # until the client goes away (the write then fails)
            await reply(exchange, chunk(b"data: more\n\n"))
            await asyncio.sleep(0.01)

    server = await serve(endless)
    connection = await pool.open(server.origin, request(), timeout_s=2)
    assert await connection.next_chunk(2) == b"data: more\n\n"
    pool.release(connection)
    # The server notices the client left: that is how a node frees the sequence's KV blocks.
    assert await eventually(lambda: server.closed == [0])
    assert connection.closed


async def test_a_large_stream_read_slowly_arrives_whole(serve, pool) -> None:
    piece = b"y" * 65536

    async def large(exchange: Exchange) -> None:
        await reply(exchange, CHUNKED_HEAD)
        for _ in range(32):  # 2 MiB: past the high-water mark, so reading pauses and resumes
            await reply(exchange, chunk(piece))
        await reply(exchange, b"0\r\n\r\n")

    server = await serve(large)
    connection = await pool.open(server.origin, request(), timeout_s=2)
    received = 0
    await asyncio.sleep(0.2)  # let the body pile up
    while (data := await connection.next_chunk(2)) is not None:
        received += len(data)
    pool.release(connection)
    assert received == 32 * len(piece)
    assert not connection.closed  # read to its end: kept for the next request


def test_keep_alive_timeout_is_read_from_the_header_value() -> None:
    assert keep_alive_timeout(b"timeout=5") == 5.0
    assert keep_alive_timeout(b"timeout=5, max=100") == 5.0
    assert keep_alive_timeout(b"max=100,Timeout = 2") == 2.0
    assert keep_alive_timeout(b"max=100") is None
    for malformed in (b"timeout=", b"timeout=soon", b"timeout=-1", b"timeout=inf", b"timeout=nan"):
        assert keep_alive_timeout(malformed) is None, malformed


@given(advertised=st.floats(0, 1e6, allow_subnormal=False), own=st.floats(0.001, 1e6))
def test_idle_expiry_is_safely_below_the_advertised_timeout_and_never_above_our_own(
    advertised: float, own: float
) -> None:
    expiry = idle_expiry(advertised, own)
    assert expiry <= own
    assert expiry <= advertised / 2 or expiry <= advertised - 1.0


def keep_alive_ok(timeout: int) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + f"keep-alive: timeout={timeout}\r\n".encode()
        + b'content-length: 12\r\n\r\n{"ok": true}'
    )


class ClosesWhenIdle:
    """A server whose keep-alive timeout is `timeout_s` and whose idle close always arrives with
    the next request: a request on a connection idle that long is dropped unanswered."""

    def __init__(self, timeout_s: int, *, advertise: bool) -> None:
        self.timeout_s = timeout_s
        self.answer = keep_alive_ok(timeout_s) if advertise else JSON_OK
        self.answered_at: dict[int, float] = {}
        self.dropped = 0

    async def __call__(self, exchange: Exchange) -> None:
        now = asyncio.get_running_loop().time()
        last = self.answered_at.get(exchange.connection)
        if last is not None and now - last >= self.timeout_s:
            self.dropped += 1
            exchange.writer.close()
            return
        await reply(exchange, self.answer)
        self.answered_at[exchange.connection] = asyncio.get_running_loop().time()


async def test_a_connection_idle_past_the_advertised_keep_alive_is_never_written_to(serve) -> None:
    behaviour = ClosesWhenIdle(1, advertise=True)
    server = await serve(behaviour)
    pool = ConnectionPool(connect_timeout_s=2.0, idle_expiry_s=30.0)  # the server's word wins
    try:
        await pool.request(server.origin, request(), timeout_s=2)
        await pool.request(server.origin, request(), timeout_s=2)
        assert server.connections == 1  # kept while the server keeps it
        await asyncio.sleep(1.2)
        assert (await pool.request(server.origin, request(), timeout_s=2)).status == 200
        assert behaviour.dropped == 0  # nothing was sent on a connection the server was closing
        assert server.connections == 2
    finally:
        await pool.aclose()


async def test_the_advertised_keep_alive_never_extends_our_own_expiry(serve) -> None:
    server = await serve(lambda exchange: reply(exchange, keep_alive_ok(60)))
    pool = ConnectionPool(connect_timeout_s=2.0, idle_expiry_s=0.1)
    try:
        await pool.request(server.origin, request(), timeout_s=2)
        await asyncio.sleep(0.3)
        await pool.request(server.origin, request(), timeout_s=2)
        assert server.connections == 2
    finally:
        await pool.aclose()


async def test_idle_time_counts_from_the_end_of_the_response_not_from_its_release(serve) -> None:
    behaviour = ClosesWhenIdle(1, advertise=False)
    server = await serve(behaviour)
    pool = ConnectionPool(connect_timeout_s=2.0, idle_expiry_s=0.5)
    try:
        connection = await pool.open(server.origin, request(), timeout_s=2)
        await asyncio.sleep(1.2)  # a slow reader: the whole response waited here
        assert await connection.read_body(2) == b'{"ok": true}'
        pool.release(connection)
        assert (await pool.request(server.origin, request(), timeout_s=2)).status == 200
        assert behaviour.dropped == 0
        assert server.connections == 2
    finally:
        await pool.aclose()


async def test_keep_alive_race_on_a_stream_is_retried_once_on_a_new_connection(serve, pool) -> None:
    async def drop_second_on_each_connection(exchange: Exchange) -> None:
        if exchange.index == 1:
            exchange.writer.close()  # closed as idle just as the request came: never answered
            return
        await reply(exchange, CHUNKED_HEAD + chunk(b"data: 1\n\n") + b"0\r\n\r\n")

    server = await serve(drop_second_on_each_connection)
    for _ in range(2):
        connection = await pool.open(server.origin, request(), timeout_s=2)
        assert await connection.next_chunk(2) == b"data: 1\n\n"
        assert await connection.next_chunk(2) is None
        pool.release(connection)
    assert [(e.connection, e.index) for e in server.exchanges] == [(0, 0), (0, 1), (1, 0)]

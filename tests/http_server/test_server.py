"""The HTTP server's limits against real sockets: slow clients are cut off by the read timeouts,
oversized requests are refused before they are read, and a connection cap holds. A small ASGI
app stands in for the gateway and the node; both serve through the same `server_config`."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from http_server import ClientDisconnected, ServerLimits, read_body, server_config
from tests.support.processes import free_port
from tests.support.threaded_server import running

LIMITS = ServerLimits(
    max_connections=4, header_timeout_s=0.5, body_timeout_s=0.5, max_header_bytes=4096, max_body_bytes=2048
)


class EchoApp:
    """Answers 200 with the body's length, or the error read_body raised, as JSON."""

    def __init__(self) -> None:
        self.disconnects = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    def stall(self, seconds: float) -> None:
        """Block the server's event loop for `seconds` from now, as a busy or starved process
        would: from an I/O callback, after which uvloop runs the timers that fell due before it
        next reads its sockets."""
        loop = self.loop
        assert loop is not None
        started = threading.Event()
        readable, writer = socket.socketpair()

        def block() -> None:
            loop.remove_reader(readable)
            started.set()
            time.sleep(seconds)
            readable.close()

        loop.call_soon_threadsafe(loop.add_reader, readable, block)
        writer.send(b"!")
        assert started.wait(5)
        writer.close()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["path"] == "/early":  # answers before reading the body, as a 401 for a bad key does
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"no"})
            return
        try:
            body = await read_body(receive, headers, LIMITS)
            status, content = 200, {"size": len(body)}
        except ClientDisconnected:
            self.disconnects += 1
            return
        except Exception as exc:  # the APIErrors read_body raises
            status, content = exc.status_code, exc.to_body()  # type: ignore[attr-defined]
        payload = json.dumps(content).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(payload)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[int, EchoApp]]:
    app = EchoApp()
    port = free_port()
    config = server_config(app, "127.0.0.1", port, LIMITS, lifespan="off", log_level="warning")
    with running(config) as server:
        app.loop = server.servers[0].get_loop()
        yield port, app


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def read_response(sock: socket.socket, *, closes: bool = True) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, whether the server then closed the connection — only waited for
    when `closes`, as a kept-alive connection stays open)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return status, headers, body[:length], closes and closed_by_server(sock)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes the connection within a few seconds (the linger is 2 s)."""
    sock.settimeout(4)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def error_of(body: bytes) -> dict[str, Any]:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def post_head(length: int, extra: str = "") -> bytes:
    return f"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: {length}\r\n{extra}\r\n".encode()


def test_a_normal_request_on_a_kept_alive_connection_is_served(served) -> None:
    port, _ = served
    with connect(port) as sock:
        for _ in range(2):
            sock.sendall(post_head(5) + b"hello")
            status, _, body, _ = read_response(sock, closes=False)
            assert status == 200 and json.loads(body) == {"size": 5}


def test_headers_sent_too_slowly_get_408_and_the_connection_is_closed(served) -> None:
    port, _ = served
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nhost: t\r\n")  # and the rest never comes
        status, _, body, closed = read_response(sock)
    assert status == 408 and error_of(body)["code"] == "request_timeout" and closed


def test_a_slowloris_trickle_does_not_reset_the_header_timeout(served) -> None:
    port, _ = served
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\n")
        started = time.monotonic()
        try:
            while time.monotonic() - started < 5:  # bounded: the server must cut us off long before
                sock.sendall(b"x-a: b\r\n")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(5)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    assert time.monotonic() - started < 5
    assert data.startswith(b"HTTP/1.1 408")


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(served) -> None:
    port, _ = served
    with connect(port) as sock:
        status, _, _, closed = read_response(sock)
    assert status == 408 and closed


def test_the_header_timeout_applies_again_to_the_next_request_on_a_kept_alive_connection(served) -> None:
    port, _ = served
    with connect(port) as sock:
        sock.sendall(post_head(2) + b"ok")
        assert read_response(sock, closes=False)[0] == 200
        sock.sendall(b"POST /x HTTP/1.1\r\n")  # the next request begins, then stalls
        status, _, _, closed = read_response(sock)
    assert status == 408 and closed


def test_a_body_sent_too_slowly_gets_408(served) -> None:
    port, _ = served
    with connect(port) as sock:
        sock.sendall(post_head(500) + b"12345678")  # 8 of the 500 bytes announced
        status, _, body, closed = read_response(sock)
    assert status == 408 and "8 bytes received" in error_of(body)["message"] and closed


def test_headers_that_arrived_while_the_server_was_stalled_are_served_not_timed_out(served) -> None:
    """The header timeout measures the client: a server too busy to read in time reads before it
    judges (uvloop runs the overdue timer before it reads the socket)."""
    port, app = served
    with connect(port) as sock:
        time.sleep(0.2)  # accepted: its header timer runs
        app.stall(LIMITS.header_timeout_s * 3)
        sock.sendall(post_head(5) + b"hello")  # in time, but unread until the stall ends
        status, _, body, _ = read_response(sock, closes=False)
    assert status == 200 and json.loads(body) == {"size": 5}


def test_a_body_that_arrived_while_the_server_was_stalled_is_served_not_timed_out(served) -> None:
    port, app = served
    with connect(port) as sock:
        sock.sendall(post_head(5))
        time.sleep(0.2)  # the app waits for the body: its body timer runs
        app.stall(LIMITS.body_timeout_s * 3)
        sock.sendall(b"hello")
        status, _, body, _ = read_response(sock, closes=False)
    assert status == 200 and json.loads(body) == {"size": 5}


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(served) -> None:
    port, _ = served
    with connect(port) as sock:
        sock.sendall(post_head(LIMITS.max_body_bytes + 1))  # no body bytes at all
        status, _, body, closed = read_response(sock)
    assert status == 413 and error_of(body)["code"] == "request_too_large" and closed


def test_a_chunked_body_is_refused_once_it_passes_the_limit(served) -> None:
    port, _ = served
    chunk = b"a" * 1000
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(3):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _, body, _ = read_response(sock)
    assert status == 413 and error_of(body)["type"] == "invalid_request_error"


def test_headers_over_the_size_limit_get_431(served) -> None:
    port, _ = served
    with connect(port) as sock:
        sock.sendall(b"GET /x HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 5000 + b"\r\n\r\n")
        status, _, body, closed = read_response(sock)
    assert status == 431 and error_of(body)["message"] and closed


def test_a_malformed_request_gets_a_json_400(served) -> None:
    port, _ = served
    with connect(port) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, _, body, closed = read_response(sock)
    assert status == 400 and error_of(body)["type"] == "invalid_request_error" and closed


def test_connections_over_the_cap_get_503_with_retry_after(served) -> None:
    port, _ = served
    held = [connect(port) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.1)  # let the server accept them
        with connect(port) as extra:
            extra.sendall(post_head(2) + b"ok")
            status, headers, body, closed = read_response(extra)
        assert status == 503 and headers["retry-after"] == "1" and closed
        assert error_of(body)["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    # Below the cap again (the held connections are gone): served.
    deadline = time.monotonic() + 5
    while True:
        with connect(port) as sock:
            sock.sendall(post_head(2) + b"ok")
            status = read_response(sock, closes=False)[0]
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 200


def test_a_client_leaving_mid_body_is_a_disconnect_not_an_error(served) -> None:
    port, app = served
    before = app.disconnects
    with connect(port) as sock:
        sock.sendall(post_head(100) + b"partial")
        time.sleep(0.1)
    deadline = time.monotonic() + 5
    while app.disconnects == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert app.disconnects == before + 1


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_answer_before_the_body_says_connection_close_and_closes_cleanly(served, framing: str) -> None:
    """Issue 32: a kept-alive connection answered before its body (401, 404, 405) must not drop the
    client's next request silently. The answer says `connection: close`; the body still sent
    after it is dropped, and the connection then ends with EOF (never a reset, which could
    destroy the answer)."""
    port, _ = served
    if framing == "chunked":
        head, body = (
            b"POST /early HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
        )
    else:
        head, body = b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\n", b"hello"
    with connect(port) as sock:
        sock.sendall(head)
        status, headers, answer, _ = read_response(sock, closes=False)
        assert (status, answer) == (401, b"no")
        assert headers.get("connection") == "close"
        time.sleep(0.3)  # the client: headers, a pause, the body, then the next request
        sock.sendall(body + b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        sock.settimeout(4)
        assert sock.recv(65536) == b""  # EOF: no reset, no answer to a request it was told not to send


def test_an_answer_after_the_whole_body_keeps_the_connection(served) -> None:
    """The early answer's close is only for a body not yet received: one that had arrived whole
    (the app just did not read it) leaves the connection kept alive."""
    port, _ = served
    with connect(port) as sock:
        sock.sendall(b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n")
        status, headers, _, _ = read_response(sock, closes=False)
        assert status == 401 and "connection" not in headers
        sock.sendall(post_head(5) + b"hello")
        status, _, body, _ = read_response(sock, closes=False)
    assert status == 200 and json.loads(body) == {"size": 5}

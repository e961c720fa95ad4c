"""uvicorn, with a connection cap, a header read timeout and a header size limit.

uvicorn's httptools protocol is extended rather than wrapped: the limits need the connection's
own events (opened, request begun, headers complete), which an ASGI app never sees; a request
refused here never reaches the app. Refusals are written directly, with `connection: close`, and
the connection is closed; in OpenAI's error format, or in the format the server was given for
the path the request named (`error_formats`: the gateway's /v1/messages answers in Anthropic's).
An app's answer given before the request's body arrived also says `connection: close` and ends
the connection cleanly (`_ServerCycle`).

With `cancel_on_disconnect`, a client that leaves once its request has arrived in full cancels
the request's task (uvicorn only flags the cycle, and an app awaiting an upstream never looks):
the app's clean-up runs at once, not when the upstream answers to nobody. The scope then says so
(`client_left`), so the app can tell this cancellation from any other; one the app lets through
ends in the server, quietly, not as an "Exception in ASGI application".
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from http_server.cork import CorkedTransport
from http_server.limits import LAST_LOOK_S, ServerLimits
from protocol.errors import APIError, RequestTimeoutError, ServiceUnavailableError, error_for_status

logger = logging.getLogger("meridian.http")

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
# After a refusal the connection is half-closed and what the client still sends is read and
# dropped for up to this long: closing a socket with unread bytes resets it, and a reset can
# destroy the refusal before the client reads it.
_LINGER_S = 2.0


# Path prefix → the error body for that door (the default: OpenAI's `error.to_body()`).
ErrorFormats = Mapping[str, Callable[[APIError], Any]]


def refusal(error: APIError, path: bytes = b"", formats: ErrorFormats | None = None) -> bytes:
    """A complete HTTP/1.1 response for `error` that closes the connection."""
    shape = next((make for prefix, make in (formats or {}).items() if path.startswith(prefix.encode())), None)
    body = msgspec.json.encode(shape(error) if shape is not None else error.to_body())
    head = [
        b"HTTP/1.1 %d %s\r\n" % (error.status_code, _REASONS.get(error.status_code, b"Error")),
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
    ]
    head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in error.headers.items()]
    return b"".join([*head, b"\r\n", body])


# Set in the request's scope when the client left while the app was still answering.
CLIENT_LEFT = "meridian.client_left"


def client_left(scope: Mapping[str, Any]) -> bool:
    """Whether the request's client left before its response was complete (and the server, with
    `cancel_on_disconnect`, cancelled the request's task for it)."""
    return CLIENT_LEFT in scope


class _ServerCycle(RequestResponseCycle):
    """uvicorn's request cycle, which keeps its task (so that a client leaving can cancel it) and
    says `connection: close` when the app answers before the request's body has arrived (401 for
    a missing key, 404, 405, 413, 408).

    Plain uvicorn keeps such a connection, reading and dropping the rest of the body for as long
    as the client sends it; ours half-closed it without saying so, and a kept-alive client's next
    request on it met EOF ("Server disconnected without sending a response"). Now the client is
    told, and the connection ends after the response (`LimitedHttpProtocol._linger`: half-closed,
    what the client still sends is dropped, then closed — never a reset that could destroy the
    response). Reading the rest instead would hold a connection for a body nobody wants, for as
    long as a slow client takes to send it."""

    closes_early = False
    task: asyncio.Task[None] | None = None
    inner_app: Any = None

    async def run_asgi(self, app: Any) -> None:
        self.task = asyncio.current_task()  # type: ignore[assignment]
        self.inner_app = app
        await super().run_asgi(self._app)

    async def _app(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.inner_app(scope, receive, send)
        except asyncio.CancelledError:
            if not client_left(scope):
                raise
            # Ours: the request ended with its client; nothing failed.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]

    def cancel_for_departure(self) -> None:
        """The client left: cancel the app's work if its request had arrived in full (else the
        app, reading the body, learns it from `receive`: read_body's ClientDisconnected)."""
        if self.task is None or self.task.done() or self.more_body or self.response_complete:
            return
        self.scope[CLIENT_LEFT] = True  # type: ignore[literal-required]
        self.task.cancel()

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and self.more_body and not self.response_started:
            self.closes_early = True
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            await super().send({**message, "headers": headers})
            # uvicorn would close the transport at the response's end, resetting a socket that
            # may hold unread body bytes; the protocol lingers instead (on_response_complete).
            self.keep_alive = True
            return
        await super().send(message)


class _HeadersTooLarge(Exception):
    """Raised from a parser callback: the request line and headers passed the size limit."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """One client connection, with the limits of `ServerLimits` (set on a subclass per server)."""

    limits = ServerLimits()
    error_formats: ErrorFormats = {}
    cancel_on_disconnect = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._path = b""  # the request's target, once the request line is read
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_last_look = False
        self._head_bytes = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # One write per loop turn, not per ASGI message (http_server/cork.py).
        super().connection_made(CorkedTransport(transport, self.loop))  # type: ignore[arg-type]
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                ServiceUnavailableError(
                    f"This server is at its limit of {self.limits.max_connections} open connections; retry.",
                    code="too_many_connections",
                    headers={"retry-after": "1"},
                )
            )
            return
        # A connection that never sends a request is held no longer than a slow one.
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        cycle = self.cycle
        super().connection_lost(exc)
        if self.cancel_on_disconnect and isinstance(cycle, _ServerCycle):
            cycle.cancel_for_departure()

    def data_received(self, data: bytes) -> None:
        if not self._refused:  # after a refusal, what the client still sends is dropped
            super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._head_timer is None:  # on a kept-alive connection: the next request has begun
            self._start_head_timer()

    def on_url(self, url: bytes) -> None:
        self._path = (self._path + url) if self._head_bytes else url
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if type(cycle) is RequestResponseCycle:
            # uvicorn builds the cycle itself; its task is made here, so every call on it goes
            # through the subclass (which adds behaviour, and no state but its task and flag).
            cycle.__class__ = _ServerCycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if (cycle.more_body or getattr(cycle, "closes_early", False)) and not self.transport.is_closing():
            # Answered before the request's body was read (401, 404, 413, 408, ...): the response
            # said `connection: close` (_ServerCycle); close, gently.
            self._linger()
            return
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to what its parser rejects (a callback's exception included).
        if self._head_bytes > self.limits.max_header_bytes:
            error = error_for_status(
                431, f"The request line and headers are larger than {self.limits.max_header_bytes} bytes."
            )
        else:
            error = error_for_status(400, f"Invalid HTTP request: {msg}")
        self._refuse(error)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.limits.max_header_bytes:
            raise _HeadersTooLarge()  # the parser stops; uvicorn then calls send_400_response

    def _start_head_timer(self, delay: float | None = None) -> None:
        self._head_last_look = delay is not None
        delay = self.limits.header_timeout_s if delay is None else delay
        self._head_timer = self.loop.call_later(delay, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self._head_last_look:
            # A busy or starved process may not have read what the client sent in time: the
            # verdict waits for one more read of the socket (completing the headers stops it).
            self._start_head_timer(LAST_LOOK_S)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A request is still being answered (pipelining): close once it is done instead.
            self.cycle.keep_alive = False
            return
        logger.info("closing a connection that sent no complete request headers in time")
        self._refuse(
            RequestTimeoutError(
                f"The request headers did not arrive within {self.limits.header_timeout_s:g} s."
            )
        )

    def _refuse(self, error: APIError) -> None:
        self.transport.write(refusal(error, self._path, self.error_formats))
        self._linger()

    def _linger(self) -> None:
        """Half-close after the last response, drop what the client still sends, then close."""
        self._refused = True
        self._stop_head_timer()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()


def server_config(
    app: Any,
    host: str,
    port: int,
    limits: ServerLimits,
    error_formats: ErrorFormats | None = None,
    *,
    cancel_on_disconnect: bool = False,
    **options: Any,
) -> uvicorn.Config:
    """A uvicorn config for `app` whose connections enforce `limits`; `options` are uvicorn's.
    `cancel_on_disconnect`: a client that leaves cancels its request's task (see module doc)."""
    attributes = {
        "limits": limits,
        "error_formats": dict(error_formats or {}),
        "cancel_on_disconnect": cancel_on_disconnect,
    }
    protocol = type("ServerProtocol", (LimitedHttpProtocol,), attributes)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        # uvloop roughly halves a server's own per-request cost where it is available.
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        timeout_keep_alive=limits.keep_alive_s,
        # uvicorn writes its `headers` from bytes encoded once: no work per request.
        headers=[("keep-alive", f"timeout={limits.keep_alive_s}")],
        **options,
    )

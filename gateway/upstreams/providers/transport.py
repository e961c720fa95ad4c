"""HTTP plumbing both adapters share: one connection pool per provider and the three timeouts.

Providers go over the same HTTP/1.1 client as nodes (gateway/http/), so they get the
same keep-alive rules: an idle connection is let go safely before the provider's own idle timeout
(its `Keep-Alive: timeout=N` when it sends one), and a request that meets a connection the
provider closed as idle just as it was reused is sent again on a new one, unseen by failover and
the breaker.

- connect: TCP and TLS connect (the pool's connect timeout).
- first byte: from asking for a connection until the response headers arrive; for a
  non-streamed answer that is most of the generation.
- idle: the longest silence while reading the body, or between two stream lines (a server
  trickling bytes without ever finishing a line is caught too).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import msgspec

from gateway.http import (
    ConnectError,
    Connection,
    ConnectionPool,
    ConnectTimeout,
    Origin,
    ReadTimeout,
    Timeout,
    TransportError,
    split_url,
)
from gateway.upstreams.providers.config import ProviderTimeouts
from gateway.upstreams.providers.errors import ProviderError, parse_retry_after
from protocol.chunk import Chunk, Completion, chunk_decoder, completion_from
from protocol.sse import SSEDecoder, SSEEvent

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
# Headers of the client's request worth passing on: tracing only. Never the gateway's own.
_FORWARDED_HEADERS = ("x-request-id",)
# The client does not decode compressed bodies, so it asks for none (without the header a
# server may pick any coding).
_FIXED_HEADERS = (
    "content-type: application/json\r\naccept-encoding: identity\r\nuser-agent: meridian-gateway\r\n"
)

# (provider, status, parsed body or None, raw text, retry_after) -> the error to raise
StatusMapper = Callable[[str, int, Any, str, float | None], ProviderError]


class Destination(NamedTuple):
    """Where a provider's requests go: parsed once from its URL."""

    origin: Origin
    host: str  # the Host header's value
    path: str


class Post(NamedTuple):
    origin: Origin
    raw: bytes  # the whole HTTP/1.1 request


def destination(url: str) -> Destination:
    origin, host, path = split_url(url)
    return Destination(origin, host, path or "/")


def build_pool(timeouts: ProviderTimeouts) -> ConnectionPool:
    return ConnectionPool(connect_timeout_s=timeouts.connect_s, max_connections=200, max_idle=50)


def build_post(
    to: Destination, payload: Any, *, auth: dict[str, str], client_headers: dict[str, str]
) -> Post:
    """A JSON POST of `payload` to the provider, with its auth and the client's tracing headers."""
    content = _encoder.encode(payload)
    lines = [f"POST {to.path} HTTP/1.1\r\nhost: {to.host}\r\n{_FIXED_HEADERS}"]
    for name in _FORWARDED_HEADERS:
        value = client_headers.get(name)
        if value is not None and "\r" not in value and "\n" not in value:
            lines.append(f"{name}: {value}\r\n")
    # The keys were checked for line breaks when they were read (resolve_api_key).
    lines.extend(f"{name}: {value}\r\n" for name, value in auth.items())
    lines.append(f"content-length: {len(content)}\r\n\r\n")
    return Post(to.origin, "".join(lines).encode() + content)


def transport_error(provider: str, exc: TransportError) -> ProviderError:
    if isinstance(exc, ConnectTimeout):
        return ProviderError(f"{provider}: connect timed out", kind="connect", status_code=504)
    if isinstance(exc, Timeout):
        return ProviderError(f"{provider}: timed out ({type(exc).__name__})", kind="timeout", status_code=504)
    if isinstance(exc, ConnectError):
        return ProviderError(f"{provider}: cannot connect: {exc}", kind="connect")
    return ProviderError(f"{provider}: {type(exc).__name__}: {exc}", kind="stream_broken")


async def open_response(
    pool: ConnectionPool,
    post: Post,
    *,
    provider: str,
    timeouts: ProviderTimeouts,
    on_status: StatusMapper,
) -> Connection:
    """Send and wait for a 2xx response's headers; the body is left to read, and the connection
    to hand back with `pool.release`. Errors are mapped by `on_status` (each provider has its own
    error format)."""
    try:
        async with asyncio.timeout(timeouts.first_byte_s):
            response = await pool.open(post.origin, post.raw, timeout_s=timeouts.first_byte_s)
    except (TimeoutError, ReadTimeout):
        raise ProviderError(
            f"{provider}: no response within {timeouts.first_byte_s}s", kind="timeout", status_code=504
        ) from None
    except TransportError as exc:
        raise transport_error(provider, exc) from None
    if 200 <= response.status < 300:
        coding = response.header(b"content-encoding")
        if coding is None or coding.strip().lower() == "identity":
            return response
        pool.release(response)
        raise ProviderError(f"{provider}: sent a {coding} body, asked for none", kind="bad_response")
    try:
        content = await read_body(response, provider=provider, timeouts=timeouts)
    finally:
        pool.release(response)
    text = content[:2000].decode("utf-8", "replace")
    try:
        parsed = _decoder.decode(content)
    except msgspec.DecodeError:
        parsed = None
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in response.headers}
    raise on_status(provider, response.status, parsed, text, parse_retry_after(headers))


async def read_body(response: Connection, *, provider: str, timeouts: ProviderTimeouts) -> bytes:
    """The whole body; the idle timeout bounds each wait for more of it."""
    try:
        return await response.read_body(timeouts.idle_s)
    except TransportError as exc:
        raise transport_error(provider, exc) from None


async def read_json(response: Connection, *, provider: str, timeouts: ProviderTimeouts) -> dict[str, Any]:
    content = await read_body(response, provider=provider, timeouts=timeouts)
    try:
        result = _decoder.decode(content)
    except msgspec.DecodeError:
        raise ProviderError(f"{provider}: response is not JSON", kind="bad_response") from None
    if not isinstance(result, dict):
        raise ProviderError(f"{provider}: response is not a JSON object", kind="bad_response")
    return result


async def drain(response: Connection, *, idle_s: float) -> None:
    """Read what is left of a stream's body after its last event (normally just the chunked
    terminator): only a connection read to its end goes back to the pool. A stall or a break here
    changes nothing for the answer, which was complete; the connection is then closed instead."""
    with contextlib.suppress(TransportError):
        while await response.next_chunk(idle_s) is not None:
            pass


class Lines:
    """The lines of a body that arrives in pieces, split where SSE splits them: at CRLF, LF or
    CR (never at the other breaks str.splitlines knows, which JSON may hold raw in a string).
    Split as bytes, where those three never occur inside a multi-byte UTF-8 character."""

    def __init__(self) -> None:
        self._pending = b""  # a line not finished yet; a trailing CR may be half of a CRLF

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._pending + data
        cr = buffer.endswith(b"\r")
        lines = (buffer[:-1] if cr else buffer).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._pending = lines.pop() + (b"\r" if cr else b"")
        return lines

    def end(self) -> list[bytes]:
        """The body ended: a last line without its line break still counts."""
        rest, self._pending = self._pending.removesuffix(b"\r"), b""
        return [rest] if rest else []


async def _next_lines(
    response: Connection, lines: Lines, *, provider: str, idle_s: float
) -> list[bytes] | None:
    """The next whole lines (at least one), None at the body's end. The idle timeout runs from
    asking until a whole line is in, so bytes trickling in without a line break do not reset it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + idle_s
    while True:
        left = deadline - loop.time()
        try:
            if left <= 0:
                raise ReadTimeout
            data = await response.next_chunk(left)
        except ReadTimeout:
            raise ProviderError(
                f"{provider}: stream idle for more than {idle_s}s", kind="timeout", status_code=504
            ) from None
        except TransportError as exc:
            raise transport_error(provider, exc) from None
        if data is None:
            return None
        received = lines.feed(data)
        if received:
            return received


async def sse_events(
    response: Connection, *, provider: str, timeouts: ProviderTimeouts
) -> AsyncIterator[SSEEvent]:
    """The events of an SSE body. Ends quietly at the end of the body: whether that was too early
    is the caller's call (it knows which event should have come last)."""
    decoder = SSEDecoder()
    lines = Lines()
    while (
        received := await _next_lines(response, lines, provider=provider, idle_s=timeouts.idle_s)
    ) is not None:
        for line in received:
            event = decoder.feed(line.decode("utf-8", "replace"))
            if event is not None:
                yield event
    for line in lines.end():
        event = decoder.feed(line.decode("utf-8", "replace"))
        if event is not None:
            yield event
    last = decoder.end()
    if last is not None:
        yield last


def decode_event(provider: str, event: SSEEvent) -> dict[str, Any]:
    try:
        data = _decoder.decode(event.data)
    except msgspec.DecodeError:
        raise ProviderError(f"{provider}: malformed stream event", kind="bad_response") from None
    if not isinstance(data, dict):
        raise ProviderError(f"{provider}: stream event is not a JSON object", kind="bad_response")
    return data


def decode_chunk(provider: str, event: SSEEvent) -> Chunk:
    """An OpenAI-format stream event as a typed chunk (protocol/chunk.py), decoded in one pass."""
    try:
        return chunk_decoder.decode(event.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise ProviderError(f"{provider}: malformed stream event", kind="bad_response") from None


def typed_completion(provider: str, value: Any) -> Completion:
    """An OpenAI-format answer (decoded JSON) as a typed Completion."""
    try:
        return completion_from(value)
    except msgspec.ValidationError as exc:
        raise ProviderError(f"{provider}: malformed response ({exc})", kind="bad_response") from None

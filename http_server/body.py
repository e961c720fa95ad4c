"""Reading a request body within the server's limits (the ASGI receive channel, any framework)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from http_server.limits import LAST_LOOK_S, ServerLimits
from protocol.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnsupportedMediaTypeError,
)

# The content codings a request body may come in (RFC 9110, 8.4.1), as zlib's window bits:
# "deflate" is the zlib format, "gzip" (and its old name) the gzip one. Clients that compress a
# long prompt use these; brotli and zstd would need a dependency.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ACCEPTED_CODINGS = "gzip, deflate"
# Larger encoded bodies are inflated off the event loop (zlib releases the GIL while it works).
_OFF_LOOP_BYTES = 64 * 1024


class ClientDisconnected(Exception):
    """The client went away before its response was ready; nothing is sent back."""


async def read_body(
    receive: Callable[[], Awaitable[Any]], headers: Mapping[str, str], limits: ServerLimits
) -> bytes:
    """The whole body, decoded if it has a Content-Encoding; or PayloadTooLargeError (413),
    RequestTimeoutError (408), UnsupportedMediaTypeError (415), InvalidRequestError (400, an
    encoding that does not decode) or ClientDisconnected. A declared Content-Length over the
    limit, or an unknown coding, is refused before reading; a decoded body is held to the same
    limit as it is inflated (a small bomb is stopped at the limit, never inflated whole)."""
    limit = limits.max_body_bytes
    codings = _codings(headers.get("content-encoding"))
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout_s
    last_look = False
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            if last_look:
                raise RequestTimeoutError(
                    f"The request body did not arrive within {limits.body_timeout_s:g} s ({size} bytes received)."
                ) from None
            # A busy or starved process may not have read what the client sent in time: the
            # socket is read once more, then only what has arrived by then counts (a deadline
            # already past cancels a receive() that would wait, never one that has a message).
            last_look = True
            await asyncio.sleep(LAST_LOOK_S)
            deadline = loop.time()
            continue
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if not codings:
        return body
    if len(body) > _OFF_LOOP_BYTES:
        return await asyncio.to_thread(_decoded, body, codings, limit)
    return _decoded(body, codings, limit)


def _codings(header: str | None) -> list[str]:
    """The codings applied to the body, in the order they were applied ("identity" is none)."""
    if not header:
        return []
    codings = [
        name for name in (part.strip().lower() for part in header.split(",")) if name and name != "identity"
    ]
    for name in codings:
        if name not in _WBITS:
            raise UnsupportedMediaTypeError(
                f"The request body's Content-Encoding {name!r} is not supported: send it as "
                f"{ACCEPTED_CODINGS} or unencoded.",
                headers={"accept-encoding": ACCEPTED_CODINGS},
            )
    return codings


def _decoded(body: bytes, codings: list[str], limit: int) -> bytes:
    for name in reversed(codings):  # the last coding applied comes off first
        body = _inflated(body, name, limit)
    return body


def _inflated(data: bytes, coding: str, limit: int) -> bytes:
    """`data` inflated, at most `limit` bytes of it; gzip may hold several members (RFC 1952)."""
    pieces: list[bytes] = []
    size = 0
    while True:
        inflater = zlib.decompressobj(_WBITS[coding])
        try:
            # One byte over the limit is enough to know it is over (size <= limit: never 0, unbounded).
            piece = inflater.decompress(data, limit + 1 - size)
        except zlib.error as exc:
            raise InvalidRequestError(f"The request body is not valid {coding} data ({exc}).") from None
        size += len(piece)
        if size > limit:
            raise PayloadTooLargeError(
                f"The request body decodes to more than this server's limit of {limit} bytes."
            )
        pieces.append(piece)
        if not inflater.eof:
            raise InvalidRequestError(f"The request body's {coding} data is cut short (it has no end).")
        data = inflater.unused_data
        if not data:
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if coding == "deflate":
            raise InvalidRequestError("The request body has bytes after the end of its deflate data.")


def _too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"The request body is larger than this server's limit of {limit} bytes.")

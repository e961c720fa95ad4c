"""Reading a request body within the server's limits (the ASGI receive channel, any framework)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from http_server.limits import LAST_LOOK_S, ServerLimits
from protocol.errors import PayloadTooLargeError, RequestTimeoutError


class ClientDisconnected(Exception):
    """The client went away before its response was ready; nothing is sent back."""


async def read_body(
    receive: Callable[[], Awaitable[Any]], headers: Mapping[str, str], limits: ServerLimits
) -> bytes:
    """The whole body, or PayloadTooLargeError (413), RequestTimeoutError (408) or
    ClientDisconnected. A declared Content-Length over the limit is refused before reading."""
    limit = limits.max_body_bytes
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
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"The request body is larger than this server's limit of {limit} bytes.")

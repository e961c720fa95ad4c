"""Abort work for a client that went away before its (non-streaming) response was ready.

Once the body has been read, the only ASGI message left for a request is `http.disconnect`
(uvicorn sends it when the socket closes, or after the response completes), so a task parked on
`receive()` learns of a hang-up at once. Streaming responses need none of this: Litestar's
`Stream` listens for the same message and cancels the body iterator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

from http_server import ClientDisconnected

T = TypeVar("T")


async def until_disconnect(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientDisconnected.

    Call only after the request body has been read in full.
    """
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    # Cancelling the task closes its engine stream, which aborts the engine request.
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected()


async def _wait_for_disconnect(request: Request[Any, Any, Any]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

"""A streamed response, sent from the request's own task and closed however it ends.

With `cancel_on_disconnect` (server.py) a client that leaves cancels the request's task wherever
it is: sending a frame, or waiting for the next one from an upstream or an engine. The frames'
generator is then closed here as an ordinary await (asyncio delivers a cancellation once), so its
`finally` (an upstream connection closed, an engine request aborted, a quota settled) runs in
full. A framework's own streaming response starts the sending as a task of its own and watches for
the disconnect beside it (Litestar: an anyio task group, whose level-triggered cancellation cuts
every await of that clean-up short), and never closes the generator.

Sent from the request's task, the first frame (often already there) also leaves in the loop turn
the head does, in the same write (cork.py), not a turn later in a write of its own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

# Litestar's Stream sent these for text/event-stream; a response's own headers win over them.
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_SSE_MEDIA_TYPE = b"text/event-stream; charset=utf-8"


class EventStream:
    """An ASGI app a route handler returns as is: `frames` as a `text/event-stream` with `headers`
    (lower-case names, header-safe values), each frame sent as it comes; the frames closed
    whatever happened (the client left, a frame failed, the head was refused)."""

    __slots__ = ("_frames", "_head")

    def __init__(self, frames: AsyncGenerator[bytes, None], headers: Mapping[str, str]) -> None:
        self._frames = frames
        head = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in {**_SSE_HEADERS, **headers}.items()]
        head.append((b"content-type", _SSE_MEDIA_TYPE))
        self._head = {"type": "http.response.start", "status": 200, "headers": head}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        frames = self._frames
        try:
            await send(self._head)
            async for frame in frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await frames.aclose()

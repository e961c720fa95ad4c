"""The SSE responses, and their guarantee that a stream is closed, however it ends.

Litestar stops iterating a stream when the client disconnects but never closes the iterator, and
an iterator that never started would not run its `finally` at all. The upstream connection and
the quota admission must be released in both cases, so the ASGI response itself closes its frames
(and, for a chat stream, the ServedStream: the one owner of all that) when it ends.

A client that leaves cancels the request's task (the server does: http_server), wherever it is:
sending a frame or waiting for the upstream's next chunk. The `finally`s below then close the
frames and the stream as ordinary awaits (asyncio's cancellation is delivered once), and the
gateway's outermost layer ends the request (api/doors.py). Litestar's own streaming response
watched for the disconnect with an anyio task group instead, whose level-triggered cancellation
needed every clean-up step shielded, at about a tenth of a stream's CPU.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

from gateway.call.served import ServedStream
from protocol.chunk import Streamed, StreamFailed, encoder
from protocol.sse import DONE, encode_data

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class _FramesResponse:
    """An ASGI app: the response's head, its frames until they end or the client leaves (the
    request's task is cancelled), then the frames closed, whatever happened."""

    def __init__(self, inner: ASGIResponse, frames: AsyncGenerator[bytes, None]) -> None:
        self._inner = inner  # Litestar's response: its head (status, encoded headers, cookies)
        self._frames = frames

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner.start_response(send)
            # Sent from this task, so the first frame (already here) leaves in the loop turn the
            # head does, in the same write (http_server/cork.py). Litestar's streaming response
            # starts the sending as a new task: its first data event left a loop turn after the
            # head, in a write of its own.
            async for frame in self._frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            await self._inner.after_response()
        finally:
            await self._frames.aclose()


class _ClosingResponse:
    """A chat stream's response, then its ServedStream closed, whatever happened."""

    def __init__(self, inner: _FramesResponse, served: ServedStream) -> None:
        self._inner = inner
        self._served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            await self._served.aclose()


class EventStream(Stream):
    """A `text/event-stream` response of `frames` with the call's `headers`."""

    def __init__(self, frames: AsyncGenerator[bytes, None], headers: Mapping[str, str]) -> None:
        self._frames = frames
        super().__init__(
            frames, media_type="text/event-stream", headers={**_SSE_HEADERS, **headers}, status_code=200
        )

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        # Litestar's Stream lets the handler's media type win over its own, and the doors'
        # handlers (annotated ASGIApp: answer.py) have JSON's.
        kwargs["media_type"] = self.media_type
        inner = super().to_asgi_response(*args, **kwargs)
        return _FramesResponse(inner, self._frames)  # type: ignore[return-value]


class SSEResponse(EventStream):
    def __init__(self, served: ServedStream, frames: AsyncGenerator[bytes, None] | None = None) -> None:
        """`frames` replaces OpenAI's `data:` framing (the Anthropic front door writes its own)."""
        self._served = served
        super().__init__(frames if frames is not None else openai_frames(served.items()), served.ctx.headers)

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        inner = super().to_asgi_response(*args, **kwargs)
        return _ClosingResponse(inner, self._served)  # type: ignore[arg-type,return-value]


async def openai_frames(items: AsyncIterator[Streamed]) -> AsyncGenerator[bytes, None]:
    """OpenAI's framing: each chunk as `data:`; a stream that could not finish ends with its error
    event (in OpenAI's error shape), then [DONE]."""
    async for item in items:
        if isinstance(item, StreamFailed):
            error = {"message": item.message, "type": item.kind, "param": None, "code": item.code}
            yield encode_data({"error": error})
            break
        yield b"data: " + encoder.encode(item) + b"\n\n"
    yield DONE

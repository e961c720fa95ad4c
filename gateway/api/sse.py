"""The SSE response for streamed answers, and its guarantee that the stream is closed.

Litestar stops iterating a stream when the client disconnects but never closes the iterator, and
an iterator that never started would not run its `finally` at all. The upstream connection and
the quota admission must be released in both cases, so the ASGI response itself closes the
ServedStream (the one owner of all that) when it ends, however it ends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import anyio
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

from gateway.call.served import ServedStream
from protocol.chunk import Streamed, StreamFailed, encoder
from protocol.sse import DONE, encode_data

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class _ClosingResponse:
    """An ASGI app: the response's head, its frames, then the stream's close, whatever happened."""

    def __init__(
        self, inner: ASGIResponse, frames: AsyncGenerator[bytes, None], served: ServedStream
    ) -> None:
        self._inner = inner  # Litestar's response: its head (status, encoded headers, cookies)
        self._frames = frames
        self._served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner.start_response(send)
            await self._send_frames(send, receive)
            await self._inner.after_response()
        finally:
            try:
                # Frames hold nothing but the chunks, which the stream's own (shielded) close ends.
                await self._frames.aclose()
            finally:
                await self._served.aclose()

    async def _send_frames(self, send: Send, receive: Receive) -> None:
        """The frames, sent from this task, so the first (already here) leaves in the loop turn
        the head does, in the same write (http_server/cork.py). A listener beside it cancels the
        sending when the client goes away. (Litestar's streaming response does it the other way
        round: it starts the sending as a new task, so the first data event left a loop turn
        after the head, in a write of its own.)"""
        async with anyio.create_task_group() as watch:
            watch.start_soon(_cancel_on_disconnect, watch.cancel_scope, receive)
            async for frame in self._frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            watch.cancel_scope.cancel()  # sent in full: stop listening


async def _cancel_on_disconnect(scope: anyio.CancelScope, receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


class EventStream(Stream):
    """A `text/event-stream` response of `frames` with the call's `headers`."""

    def __init__(self, frames: AsyncGenerator[bytes, None], headers: Mapping[str, str]) -> None:
        super().__init__(
            frames, media_type="text/event-stream", headers={**_SSE_HEADERS, **headers}, status_code=200
        )

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        # Litestar's Stream lets the handler's media type win over its own, and the doors'
        # handlers (annotated ASGIApp: answer.py) have JSON's.
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)


class SSEResponse(EventStream):
    def __init__(self, served: ServedStream, frames: AsyncGenerator[bytes, None] | None = None) -> None:
        """`frames` replaces OpenAI's `data:` framing (the Anthropic front door writes its own)."""
        self._served = served
        self._frames = frames if frames is not None else openai_frames(served.items())
        super().__init__(self._frames, served.ctx.headers)

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        inner = super().to_asgi_response(*args, **kwargs)
        return _ClosingResponse(inner, self._frames, self._served)  # type: ignore[return-value]


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

"""The SSE response for streamed answers, and its guarantee that the stream is closed.

Litestar stops iterating a stream when the client disconnects but never closes the iterator, and
an iterator that never started would not run its `finally` at all. The upstream connection and
the quota admission must be released in both cases, so the ASGI response itself closes the
ServedStream (the one owner of all that) when it ends, however it ends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

from gateway.call.served import ServedStream
from protocol.chunk import Streamed, StreamFailed, encoder
from protocol.sse import DONE, encode_data

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class _ClosingResponse:
    """An ASGI app: the wrapped streaming response, then the stream's close, whatever happened."""

    def __init__(
        self, inner: ASGIResponse, frames: AsyncGenerator[bytes, None], served: ServedStream
    ) -> None:
        self._inner = inner
        self._frames = frames
        self._served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            try:
                # Frames hold nothing but the chunks, which the stream's own (shielded) close ends.
                await self._frames.aclose()
            finally:
                await self._served.aclose()


class SSEResponse(Stream):
    def __init__(self, served: ServedStream, frames: AsyncGenerator[bytes, None] | None = None) -> None:
        """`frames` replaces OpenAI's `data:` framing (the Anthropic front door writes its own)."""
        self._served = served
        self._frames = frames if frames is not None else openai_frames(served.items())
        super().__init__(
            self._frames,
            media_type="text/event-stream",
            headers={**_SSE_HEADERS, **served.ctx.headers},
            status_code=200,
        )

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

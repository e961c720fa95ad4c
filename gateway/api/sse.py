"""The SSE response for streamed completions: OpenAI's `data:` framing, and guaranteed clean-up.

Litestar stops iterating a stream when the client disconnects but never closes the iterator, and
an iterator that never started would not run its `finally` at all. The upstream connection and
the quota admission must be released in both cases, so the ASGI response itself closes the
stream when it ends, however it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

from gateway.runtime.tasks import run_shielded
from gateway.streaming.client_stream import ClientStream
from protocol.sse import DONE as SSE_DONE
from protocol.sse import encode_data as sse_event

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class _ClosingResponse:
    """An ASGI app: the wrapped streaming response, then `on_close` (shielded) whatever happened."""

    def __init__(self, inner: ASGIResponse, on_close: Callable[[], Awaitable[None]]) -> None:
        self._inner = inner
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            await run_shielded(self._on_close, what="close client stream")


class ClientStreamResponse(Stream):
    def __init__(self, stream: ClientStream, frames: AsyncIterator[bytes] | None = None) -> None:
        """`frames` replaces OpenAI's `data:` framing (the Anthropic front door writes its own)."""
        self._client_stream = stream
        self._frames = frames if frames is not None else _frames(stream)
        super().__init__(
            self._frames,
            media_type="text/event-stream",
            headers={**_SSE_HEADERS, **stream.ctx.headers},
            status_code=200,
        )

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        inner = super().to_asgi_response(*args, **kwargs)
        return _ClosingResponse(inner, self._close)  # type: ignore[return-value]

    async def _close(self) -> None:
        await self._frames.aclose()
        await self._client_stream.aclose()


async def _frames(stream: ClientStream) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(stream.chunks()) as chunks:
        async for chunk in chunks:
            yield sse_event(chunk)
    yield SSE_DONE

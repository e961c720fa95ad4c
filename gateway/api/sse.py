"""The generation doors' SSE responses, and their guarantee that a stream is closed, however it ends.

Each is http_server's `EventStream`, an ASGI app a handler returns as is (like answer.py's
`Answer`): its frames are sent from the request's task and closed however the response ended. A
client that leaves cancels that task (http_server's `cancel_on_disconnect`) wherever it is,
sending a frame or waiting for the upstream's next chunk; the closes then run as ordinary awaits,
and the gateway's outermost layer counts the request (api/doors.py). A chat stream's ServedStream
(the one owner of the upstream connection, the lease, the admission ticket and the quota's
settlement) is closed after its frames, even when they never started: a generator that never
started runs no `finally` of its own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from litestar.types import Receive, Scope, Send

from gateway.call.served import ServedStream
from http_server import EventStream
from protocol.chunk import Streamed, StreamFailed, encoder
from protocol.sse import DONE, encode_data


class SSEResponse(EventStream):
    """A chat stream's response: its frames, then its ServedStream closed, whatever happened."""

    __slots__ = ("_served",)

    def __init__(self, served: ServedStream, frames: AsyncGenerator[bytes, None] | None = None) -> None:
        """`frames` replaces OpenAI's `data:` framing (the Anthropic front door writes its own)."""
        self._served = served
        super().__init__(frames if frames is not None else openai_frames(served.items()), served.ctx.headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._served.aclose()


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

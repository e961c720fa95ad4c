"""Server-Sent Events for a started generation, in OpenAI's chunk sequence.

Order: the format's opening chunks (chat: the role), one chunk per engine delta that adds
something, a chunk with finish_reason, the usage chunk (`choices: []`) if asked for, then
`data: [DONE]`. A failure after the first byte becomes an OpenAI error event followed by
[DONE], so a client never waits on a stream that will not end.

Backpressure: this generator pulls the next engine delta only after the previous chunk was
handed to uvicorn (http_server's `EventStream`), and uvicorn's `send` waits while its socket
buffer is above the high-water mark (64 KiB). So a slow reader holds at most that much here; the
engine keeps generating into the request's own queue, which `max_tokens` bounds (one entry per
step).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from protocol.openai import Usage
from protocol.sse import DONE as SSE_DONE
from protocol.sse import encode_data as sse_event
from protocol.timing import TIMINGS_FIELD
from regional_node.server.errors import aborted_error, api_error
from regional_node.server.generation import Generation
from regional_node.server.wire import usage

if TYPE_CHECKING:
    from regional_node.engine import RequestDelta


class ChunkSource(Protocol):
    """What chat and completions each render for a stream (server/chat.py, server/completions.py)."""

    def opening(self) -> Sequence[Any]: ...

    def piece(self, delta: RequestDelta) -> Any | None: ...

    def closing(self, finish_reason: str, stop_reason: str | int | None) -> Any: ...

    def usage_chunk(self, chunk_usage: Usage) -> Any: ...


async def sse_stream(
    generation: Generation, source: ChunkSource, *, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    """The response body of a streaming request. Always ends the engine request on exit."""
    try:
        for chunk in source.opening():
            yield sse_event(chunk)
        async for delta in generation:
            chunk = source.piece(delta)
            if chunk is not None:
                yield sse_event(chunk)
        last = generation.last
        if last is None or not last.finished or last.finish_reason not in ("stop", "length"):
            # An engine abort (shutdown) is never passed off as a finished answer.
            yield sse_event(aborted_error().to_body())
        else:
            yield sse_event(source.closing(last.finish_reason, last.stop_reason))
            if include_usage:
                chunk = source.usage_chunk(
                    usage(last.prompt_tokens, last.num_output_tokens, last.cached_tokens)
                )
                # The whole latency breakdown rides on the last chunk as an extension field.
                timings = generation.timing().to_wire()
                yield sse_event({**msgspec.to_builtins(chunk), TIMINGS_FIELD: timings})
    except Exception as exc:
        # CancelledError (the client left) is not caught: there is nobody to tell.
        yield sse_event(api_error(exc, prompt_param=generation.request.prompt_param).to_body())
        await generation.close("error")
    finally:
        await generation.close()
    yield SSE_DONE

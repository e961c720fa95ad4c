"""A stream as the client gets it: the pipeline's own generator, already started.

`RequestPipeline.stream` starts its generator up to the first chunk, so its `finally` (which
releases the upstream, the lease and the admission ticket, and settles the quota) always runs
when the generator is closed, even if the client leaves before the first byte is written. The
front door iterates `items` and calls `aclose()` exactly once however the response ended
(finished, failed, client gone); closing twice is harmless. Closing runs shielded: a cancelled
response still settles.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from gateway.call.context import CallContext
from gateway.runtime.tasks import run_shielded
from protocol.chunk import Streamed


class ServedStream:
    def __init__(self, ctx: CallContext, items: AsyncGenerator[Streamed | None, None]) -> None:
        self.ctx = ctx
        self._items = items
        self._closed = False

    async def items(self) -> AsyncGenerator[Streamed, None]:
        """The client's chunks, then (for a stream that could not finish) its StreamFailed."""
        async for item in self._items:
            if item is not None:
                yield item

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await run_shielded(self._items.aclose, what="release client stream")

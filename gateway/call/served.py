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
from typing import cast

from gateway.call.context import CallContext
from gateway.runtime.tasks import run_shielded
from protocol.chunk import Streamed


class ServedStream:
    def __init__(self, ctx: CallContext, items: AsyncGenerator[Streamed | None, None]) -> None:
        """`items`: the pipeline's generator, past the one None it yields when opened."""
        self.ctx = ctx
        self._items = cast(AsyncGenerator[Streamed, None], items)
        self._closed = False

    def items(self) -> AsyncGenerator[Streamed, None]:
        """The client's chunks, then (for a stream that could not finish) its StreamFailed: the
        pipeline's generator itself (no generator around it: each one is a hop per chunk)."""
        return self._items

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await run_shielded(self._items.aclose, what="release client stream")

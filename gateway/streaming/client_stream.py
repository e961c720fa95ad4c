"""A client stream the pipeline opened: iterate `chunks()`; `aclose()` ends it exactly once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from gateway.request.context import CallContext
from gateway.runtime.tasks import run_shielded
from gateway.streaming.relay import StreamRelay


class ClientStream:
    """Owns the relay (the upstream connection), the quota lease keeper and `on_close`, which
    settles the quota and records the outcome. Idempotent `aclose()`: the SSE response calls it
    whether the stream ended, failed or the client went away."""

    def __init__(
        self,
        ctx: CallContext,
        relay: StreamRelay,
        lease: AsyncExitStack,
        *,
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        self.ctx = ctx
        self._relay = relay
        self._lease = lease
        self._on_close = on_close
        self._closed = False

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async with contextlib.aclosing(self._relay.chunks()) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._relay.aclose()
        await run_shielded(self._lease.aclose, what="stop lease keeper")
        await run_shielded(self._on_close, what="finish stream")

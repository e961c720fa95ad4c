"""A stream as the client gets it, and the one object that owns closing it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack
from typing import Any

from gateway.request.context import CallContext
from gateway.runtime.tasks import run_shielded


class ServedStream:
    """The client's chunks plus everything that must end with them: the upstream connection, the
    quota lease and the settlement, registered on one exit stack in the order they were taken.

    The SSE response calls `aclose()` exactly once however the response ended (finished, failed,
    client gone, or never started); it stops the chunks first, so nothing reads from an upstream
    that is being closed. Closing twice is harmless.
    """

    def __init__(
        self, ctx: CallContext, chunks: AsyncGenerator[dict[str, Any], None], owned: AsyncExitStack
    ) -> None:
        self.ctx = ctx
        self.chunks = chunks
        self._owned = owned
        self._closed = False

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await run_shielded(self._release, what="release client stream")

    async def _release(self) -> None:
        try:
            await self.chunks.aclose()
        finally:
            await self._owned.aclose()

"""Stopping the gateway's owned background tasks (watchers, probers, sync loops) on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait until it has ended; its own CancelledError is expected, not raised."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

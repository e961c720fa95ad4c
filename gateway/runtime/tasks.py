"""Owned tasks and clean-up: the one shielding helper and the one way to stop a background task.

Clean-up must finish even when the request around it is being cancelled.

Litestar runs on anyio, whose cancellation is level-triggered: inside a cancelled scope every
await is cancelled again, so a plain `await response.aclose()` in a `finally` after a client
disconnect would not run. Shielding (bounded by a timeout, so a hung store cannot hang the
request's task) lets settlement and upstream closes complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

logger = logging.getLogger(__name__)


async def run_shielded(
    step: Callable[[], Awaitable[object]], *, timeout_s: float = 5.0, what: str = ""
) -> None:
    """Await `step()` shielded from cancellation, at most `timeout_s`; log (never raise) failures."""
    # One scope that both shields and bounds: it runs on every request's clean-up path. Its
    # deadline is on anyio's clock, which on asyncio is the loop's (read directly: anyio's
    # current_time() looks the backend up on every call).
    deadline = asyncio.get_running_loop().time() + timeout_s
    with anyio.CancelScope(shield=True, deadline=deadline) as scope:
        try:
            await step()
        except Exception:
            logger.exception("clean-up step failed: %s", what or step)
    if scope.cancelled_caught:
        logger.warning("clean-up step timed out after %.1fs: %s", timeout_s, what or step)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait until it has ended; its own CancelledError is expected, not raised."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

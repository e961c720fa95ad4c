"""Owned tasks and clean-up: the one shielding helper and the one way to stop a background task.

Clean-up must finish even when the request around it is being cancelled (a client that left
mid-stream, a Redis call's deadline, a server shutting down), and must not hang the request's
task when a store hangs. asyncio cancellation is edge-triggered: a task cancelled once can await
again in its `finally`, but a second cancellation would cut a clean-up short, so each clean-up
step runs as a task of its own, which the caller's cancellation does not reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)


async def run_shielded(
    step: Callable[[], Awaitable[object]], *, timeout_s: float = 5.0, what: str = ""
) -> None:
    """Await `step()` shielded from cancellation, at most `timeout_s`; log (never raise) failures.

    A caller cancelled meanwhile still waits for the step to end, then gets its CancelledError.
    """
    loop = asyncio.get_running_loop()
    caller = asyncio.current_task()
    assert caller is not None
    cancels_before = caller.cancelling()
    task = loop.create_task(_awaited(step))
    deadline = loop.call_later(timeout_s, task.cancel)
    try:
        while not task.done():
            # shield(): a cancelled caller stops waiting here, the step goes on; failures are
            # read from the task below.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(task)
    finally:
        deadline.cancel()
    if task.cancelled():
        logger.warning("clean-up step timed out after %.1fs: %s", timeout_s, what or step)
    elif (error := task.exception()) is not None:
        logger.error("clean-up step failed: %s", what or step, exc_info=error)
    if caller.cancelling() > cancels_before:
        raise asyncio.CancelledError


async def _awaited(step: Callable[[], Awaitable[object]]) -> None:
    await step()


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait until it has ended; its own CancelledError is expected, not raised."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

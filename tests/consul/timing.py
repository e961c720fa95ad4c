"""Waiting for asynchronous effects in tests, with generous bounds for a shared, busy machine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(predicate: Callable[[], bool], within: float = 5.0, interval: float = 0.02) -> float:
    """Wait until `predicate()` holds; return how long it took (fail the test after `within` seconds)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(interval)
    return time.monotonic() - start

"""Waiting on a condition in a test: polled until it holds, failing with `what` at a deadline
generous enough for a loaded 2-core machine (tests never depend on the machine's speed)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)

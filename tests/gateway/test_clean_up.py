"""Clean-up under cancellation: `run_shielded` finishes its step however often the caller is
cancelled meanwhile, and bounds it. (What cancels a request's task when its client leaves, and
what the clean-up then releases: tests/http_server/test_departures.py,
tests/gateway/test_client_leaves.py.)"""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.runtime.tasks import run_shielded


@settings(max_examples=60, deadline=None)
@given(cancels=st.lists(st.integers(0, 3), max_size=4), steps=st.integers(1, 4))
def test_a_step_finishes_however_often_its_caller_is_cancelled(cancels: list[int], steps: int) -> None:
    """The caller, once the step has begun, is cancelled at any of the step's awaits, any number of times: the step still
    runs to its end, and the caller gets its CancelledError only after it."""

    async def scenario() -> None:
        done: list[str] = []
        inside = asyncio.Event()

        async def step() -> None:
            inside.set()
            for _ in range(steps):
                await asyncio.sleep(0)
            done.append("step")

        async def caller() -> None:
            try:
                await run_shielded(step, what="test")
            finally:
                done.append("caller")

        task = asyncio.get_running_loop().create_task(caller())
        await inside.wait()
        reached = False  # a cancellation reached the caller before it was done
        for turns in cancels:
            for _ in range(turns):
                await asyncio.sleep(0)
            reached |= task.cancel()
        results = await asyncio.gather(task, return_exceptions=True)
        assert done == ["step", "caller"]
        if reached:
            assert isinstance(results[0], asyncio.CancelledError)
        else:
            assert results[0] is None

    asyncio.run(scenario())


async def test_a_hung_step_is_given_up_at_its_deadline(caplog: pytest.LogCaptureFixture) -> None:
    ended = asyncio.Event()

    async def hung() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(run_shielded(hung, timeout_s=0.05, what="hung store"), 30)
    assert ended.is_set()  # the step itself was cancelled, not left running
    assert "timed out" in caplog.text and "hung store" in caplog.text


async def test_a_failing_step_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def failing() -> None:
        raise RuntimeError("store is down")

    with caplog.at_level(logging.ERROR):
        await run_shielded(failing, what="settle")
    assert "store is down" in caplog.text and "settle" in caplog.text

"""The Redis-call deadline: punctual on a healthy loop, patient with a congested one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gateway.quota.deadline import LoopLag, ReplyClock, within


async def test_call_that_never_answers_times_out_on_time() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await within(lambda: asyncio.sleep(10), 0.05, 1.0)
    assert time.monotonic() - start < 0.15


async def test_answer_before_the_deadline_is_returned() -> None:
    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 7

    assert await within(answer, 0.2, 1.0) == 7


async def test_busy_loop_does_not_turn_an_answered_call_into_a_timeout() -> None:
    """The loop is blocked past the deadline while the answer is ready: the answer wins."""

    async def answer() -> str:
        await asyncio.sleep(0.01)
        return "ok"

    async def hog() -> None:
        await asyncio.sleep(0)
        time.sleep(0.2)  # noqa: ASYNC251 - the loop is stuck, as on an overloaded gateway

    hogging = asyncio.create_task(hog())
    assert await within(answer, 0.05, 1.0) == "ok"
    await hogging


async def test_congested_loop_still_gives_up_at_the_hard_limit() -> None:
    async def hog_repeatedly() -> None:
        for _ in range(20):
            time.sleep(0.06)  # noqa: ASYNC251 - a congested loop
            await asyncio.sleep(0)

    hogging = asyncio.create_task(hog_repeatedly())
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await within(lambda: asyncio.sleep(10), 0.05, 0.4)
    assert time.monotonic() - start < 0.4 + 0.4  # the hog delays every step by up to 60 ms
    await hogging


async def test_outer_cancellation_is_not_turned_into_a_timeout() -> None:
    task = asyncio.create_task(within(lambda: asyncio.sleep(10), 5.0, 5.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@asynccontextmanager
async def slow_loop(iteration_s: float) -> AsyncIterator[LoopLag]:
    """Every loop iteration takes `iteration_s` (blocked, as on an overloaded gateway); yields a
    LoopLag that has already seen it."""
    stop = asyncio.Event()

    async def slice_hog() -> None:
        while not stop.is_set():
            time.sleep(iteration_s)  # noqa: ASYNC251 - the loop is stuck this long every iteration
            await asyncio.sleep(0)

    lag = LoopLag()
    lag.ensure_started()
    hogging = asyncio.create_task(slice_hog())
    await asyncio.sleep(0.1)
    try:
        yield lag
    finally:
        stop.set()
        await hogging
        await lag.close()


async def test_answer_delayed_by_many_slow_loop_iterations_is_not_a_timeout() -> None:
    """Congestion in many short slices (no single late deadline): LoopLag notices it."""

    async def many_hops() -> str:
        for _ in range(10):  # like pool checkout, send, read, release: one iteration each
            await asyncio.sleep(0)
        return "ok"

    async with slow_loop(0.04) as lag:
        assert await within(many_hops, 0.12, 2.0, lag) == "ok"


async def test_redis_answering_other_calls_keeps_a_slow_call_alive() -> None:
    """Replies to other calls prove Redis is up: this call's slowness is the gateway's."""
    replies = ReplyClock()

    async def other_calls_answered() -> None:
        for _ in range(30):
            await asyncio.sleep(0.01)
            replies.mark()

    async def slow_to_be_processed() -> str:
        await asyncio.sleep(0.25)
        return "ok"

    answering = asyncio.create_task(other_calls_answered())
    assert await within(slow_to_be_processed, 0.08, 2.0, None, replies) == "ok"
    await answering
    with pytest.raises(TimeoutError):  # the same call with Redis silent: a timeout
        await within(slow_to_be_processed, 0.08, 2.0, None, ReplyClock())


async def test_loop_slowed_below_a_quarter_of_the_timeout_still_gets_its_reply_iterations() -> None:
    """Iterations of 12 ms (lag well under timeout/4): a reply that lands at the deadline still
    needs a few of them to reach the caller. A threshold on "congested" once declared such calls
    dead on a burst's first admissions, and the gateway answered on local shares beside Redis."""

    async def answered_at_the_deadline() -> str:
        await asyncio.sleep(0.2)  # the reply reaches the socket...
        for _ in range(4):  # ... and takes four iterations to be read and handed over
            await asyncio.sleep(0)
        return "ok"

    async with slow_loop(0.012) as lag:
        assert await within(answered_at_the_deadline, 0.2, 2.0, lag) == "ok"

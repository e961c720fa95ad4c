"""A timeout for Redis calls that tells a slow Redis from a busy gateway.

asyncio.timeout measures event-loop time. When the gateway's own loop is congested (hundreds of
requests on a small CPU), a Redis reply that arrived in time still waits its turn for several
loop iterations (pool checkout, send, read, release), and a plain timeout then declares Redis
down: the gateway fails open and admits on local shares on top of what Redis admitted, which
breaks exactness exactly when load is highest.

So at the deadline a call is not given up while there is evidence that the gateway, not Redis,
is slow, up to `congested_s` in all:
- Redis answered another call of this store since this one started (`ReplyClock`), and recently
  (within the timeout or two slow loop iterations): Redis is alive, replies are just processed
  late. Checked again every `timeout_s`.
- The loop has been slow (`LoopLag`, a small owned task measuring how late the loop runs its
  callbacks; or this deadline itself fired late): the call may run until
  `timeout + REPLY_ITERATIONS x slowest recent iteration`. No threshold decides "congested": on
  a healthy loop this adds a few milliseconds, and a loop whose iterations took 41 ms (below the
  old threshold of timeout/4) once had a burst's first admissions declared dead.
Otherwise both checks are made once more one loop iteration later (so a reply that arrived
together with the deadline, or an iteration that turns out slow, still counts) and the call is
cancelled if they still find nothing. With a healthy loop a hung Redis costs `timeout_s`; a busy
loop adds a few of its own iterations; only calls in flight when Redis dies under load can wait
up to `congested_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Loop iterations between a Redis reply reaching the socket and the caller holding the result
# (reader wake-up, parse, pool release, task resumption), with some slack for pool queueing.
REPLY_ITERATIONS = 4


class ReplyClock:
    """When the store last got any reply from Redis (loop time)."""

    def __init__(self) -> None:
        self.last = float("-inf")

    def mark(self) -> None:
        self.last = asyncio.get_running_loop().time()


class LoopLag:
    """How late the running loop has been recently (seconds), sampled every `period_s`."""

    def __init__(self, period_s: float = 0.01, memory_s: float = 1.0):
        self._period_s = period_s
        self._memory_s = memory_s
        self._samples: deque[tuple[float, float]] = deque()
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sample(), name="quota-loop-lag")

    def recent_max(self) -> float:
        loop = asyncio.get_running_loop()
        horizon = loop.time() - self._memory_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        return max((lag for _, lag in self._samples), default=0.0)

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self._period_s)
            now = loop.time()
            self._samples.append((now, max(0.0, now - before - self._period_s)))
            if len(self._samples) > 4 * self._memory_s / self._period_s:
                self._samples.popleft()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
            self._task = None


async def within(
    call: Callable[[], Awaitable[T]],
    timeout_s: float,
    congested_s: float,
    lag: LoopLag | None = None,
    replies: ReplyClock | None = None,
) -> T:
    """Await `call()`; raise TimeoutError if it has not answered in time (see module doc)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    if lag is not None:
        lag.ensure_started()
    started = loop.time()
    hard_stop = started + max(timeout_s, congested_s)
    state = {"finished": False, "expired": False}
    handles: list[asyncio.Handle] = []

    def on_deadline(deadline: float, last_look: bool = False) -> None:
        if state["finished"]:
            return
        now = loop.time()
        # A reply needs a few loop iterations after it arrives; on a slow loop, allow that many
        # iterations at the slowest recent iteration length (this deadline's own lateness counts).
        slowest = max(now - deadline, lag.recent_max() if lag is not None else 0.0)
        if replies is not None and replies.last > max(started, now - max(timeout_s, 2 * slowest)):
            if now < hard_stop:
                next_deadline = min(now + timeout_s, hard_stop)
                handles.append(loop.call_at(next_deadline, on_deadline, next_deadline))
                return
        allowed_end = min(started + timeout_s + REPLY_ITERATIONS * slowest, hard_stop)
        if now < allowed_end:
            handles.append(loop.call_at(allowed_end, on_deadline, allowed_end))
            return
        if last_look:
            state["expired"] = True
            task.cancel()
        else:
            # Look again one iteration later, with that iteration's length as lag: a reply read,
            # or a long iteration begun, after this callback would otherwise go unseen.
            handles.append(loop.call_soon(on_deadline, now, True))

    first = started + timeout_s
    handles.append(loop.call_at(first, on_deadline, first))
    try:
        return await call()
    except asyncio.CancelledError:
        if state["expired"] and task.uncancel() == 0:
            since = (
                "none" if replies is None or replies.last <= started else f"at {replies.last - started:.3f}s"
            )
            lagged = lag.recent_max() if lag is not None else 0.0
            raise TimeoutError(
                f"no answer within {loop.time() - started:.3f}s (last reply to any call since: {since}; "
                f"loop lag {lagged:.3f}s)"
            ) from None
        raise
    finally:
        state["finished"] = True
        for handle in handles:
            handle.cancel()

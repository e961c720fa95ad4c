"""AsyncEngine's bounded tier queues on a real engine: refusals take nothing, arrivals together
cannot overfill a queue, and stats() reports the queue, its bounds, the drain rate and the wait.

The queue is held full deterministically: the engine runs one sequence at a time
(max_num_seqs=1) and a long request holds that slot, so everything submitted after it waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from regional_node.engine import (
    AsyncEngine,
    LLMEngine,
    QueueFullError,
    QueueLimits,
    RequestDelta,
    SamplingParams,
)
from tests.support.checkpoints import make_checkpoint

PROMPT = 40
BOUND = 100  # two PROMPT-token requests fit, a third does not
# Long enough that the holder never finishes while a test runs (it is aborted at the end).
HOLD = SamplingParams(max_tokens=20000, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def long_context_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("long"), "llama", "tiny", max_position_embeddings=32768)


@pytest.fixture
async def engine(long_context_checkpoint: Path) -> AsyncIterator[AsyncEngine]:
    llm = LLMEngine.from_pretrained(long_context_checkpoint, max_num_seqs=1, num_kv_blocks=1400)
    engine = AsyncEngine(llm, QueueLimits(max_waiting_tokens={"interactive": BOUND, "batch": BOUND}))
    await engine.start()
    yield engine
    await engine.shutdown()


def prompt(seed: int) -> list[int]:
    return [(seed * 37 + i) % 2000 for i in range(PROMPT)]


async def hold(engine: AsyncEngine) -> AsyncIterator[RequestDelta]:
    """Start the long request and return once it runs (its first token is out)."""
    holder = engine.generate([5, 6, 7], HOLD, request_id="holder", priority="batch")
    await anext(holder)
    return holder


class Batch:
    """Requests submitted in the same event-loop turn: each one's first `anext` runs as a task."""

    def __init__(self, engine: AsyncEngine, priorities: list[str], first: int = 0) -> None:
        self.streams = [
            engine.generate(prompt(first + i), SHORT, request_id=f"r{first + i}", priority=p)
            for i, p in enumerate(priorities)
        ]
        self.tasks = [asyncio.create_task(anext(stream)) for stream in self.streams]  # type: ignore[arg-type]

    async def submitted(self) -> Batch:
        await asyncio.sleep(0)  # every task runs to its first suspension: admitted, or refused
        return self

    @property
    def admitted(self) -> list[bool]:
        return [not task.done() for task in self.tasks]

    def refusals(self) -> list[QueueFullError]:
        return [t.exception() for t in self.tasks if t.done() and isinstance(t.exception(), QueueFullError)]  # type: ignore[misc]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for stream in self.streams:
            await stream.aclose()  # type: ignore[attr-defined]


async def test_requests_arriving_together_cannot_overfill_a_tier_and_a_refusal_takes_nothing(
    engine: AsyncEngine,
) -> None:
    holder = await hold(engine)
    before = engine.stats()
    batch = await Batch(engine, ["batch"] * 5).submitted()
    assert batch.admitted == [True, True, False, False, False]
    errors = batch.refusals()
    assert len(errors) == 3 and {(e.tier, e.reason) for e in errors} == {("batch", "queue_tokens")}
    assert all(e.retry_after_s >= 1 for e in errors)

    stats = engine.stats()
    assert stats["waiting_tokens_by_tier"] == {"interactive": 0, "batch": 2 * PROMPT}
    assert stats["num_waiting"] == 2 and stats["num_running"] == 1
    # Once the engine has taken the two adds it has seen exactly their prompts: the refused
    # requests never reached it.
    for _ in range(500):
        if engine.engine.prompt_tokens_total > before["prompt_tokens_total"]:
            break
        await asyncio.sleep(0.01)
    assert engine.engine.prompt_tokens_total == before["prompt_tokens_total"] + 2 * PROMPT
    assert engine.stats()["waiting_tokens_by_tier"] == stats["waiting_tokens_by_tier"]

    # With the holder gone, the admitted requests run.
    await holder.aclose()
    firsts = await asyncio.gather(*batch.tasks[:2])
    assert [delta.request_id for delta in firsts] == ["r0", "r1"]
    await batch.close()
    await wait_idle(engine)


async def test_interactive_is_admitted_while_batch_is_refused(engine: AsyncEngine) -> None:
    holder = await hold(engine)
    batch = await Batch(engine, ["batch", "batch", "batch"]).submitted()
    assert batch.admitted == [True, True, False]
    interactive = await Batch(engine, ["interactive", "interactive"], first=3).submitted()
    assert interactive.admitted == [True, True]
    assert engine.stats()["waiting_tokens_by_tier"] == {"interactive": 2 * PROMPT, "batch": 2 * PROMPT}
    await interactive.close()
    await batch.close()
    await holder.aclose()
    await wait_idle(engine)


async def test_stats_report_the_queue_its_bounds_the_drain_rate_and_the_wait(engine: AsyncEngine) -> None:
    idle = engine.stats()
    assert idle["waiting_tokens_by_tier"] == {"interactive": 0, "batch": 0}
    assert idle["queue_bound_tokens"] == {"interactive": BOUND, "batch": BOUND}
    assert idle["drain_tokens_per_s"] == 0.0 and idle["queue_wait_s"] == 0.0  # never stepped

    holder = await hold(engine)
    batch = await Batch(engine, ["interactive", "batch", "batch"]).submitted()
    stats = engine.stats()
    assert stats["drain_tokens_per_s"] > 0  # the holder decodes
    assert stats["waiting_tokens"] == 3 * PROMPT
    # The engine's one slot is held and nothing has finished lately: a new request's wait for a
    # slot is unknown (the Retry-After cap), then come its steps at the measured step time.
    cap = engine.limits.max_retry_after_s
    by_tier = stats["first_token_s_by_tier"]
    assert stats["queue_wait_s"] == by_tier["batch"] and cap < by_tier["interactive"] <= by_tier["batch"]
    await batch.close()
    await holder.aclose()
    await wait_idle(engine)


async def wait_idle(engine: AsyncEngine) -> None:
    for _ in range(500):
        stats = engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_blocks_used"] == 0:
            assert stats["waiting_tokens_by_tier"] == {"interactive": 0, "batch": 0}
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not free its requests: {engine.stats()}")


async def test_a_wait_limit_refuses_on_the_recent_step_time_with_nothing_waiting(
    long_context_checkpoint: Path,
) -> None:
    """Idle, the engine admits whatever its last steps took; busy (a request decoding, nothing
    waiting), the estimate is at least two of its recent steps, past a limit shorter than one
    step: refused, taking nothing, while batch (no limit) is still admitted."""
    llm = LLMEngine.from_pretrained(long_context_checkpoint, max_num_seqs=4, num_kv_blocks=1400)
    engine = AsyncEngine(llm, QueueLimits(max_wait_s={"interactive": 1e-6}))
    await engine.start()
    try:
        assert engine.stats()["first_token_s_by_tier"] == {"interactive": 0.0, "batch": 0.0}
        served = [d async for d in engine.generate(prompt(1), SHORT, priority="interactive")]
        assert served[-1].finished
        # Idle again, with steps on record: the estimate is one step of a prompt, and the wait
        # limit does not apply (nothing to wait behind): admitted.
        cost = llm.drain.step_cost()
        assert cost.measured
        assert engine.stats()["first_token_s_by_tier"]["interactive"] == pytest.approx(cost.step_s(1))
        again = [d async for d in engine.generate(prompt(2), SHORT, priority="interactive")]
        assert again[-1].finished

        holder = await hold(engine)
        stats = engine.stats()
        assert stats["num_waiting"] == 0 and stats["num_running"] == 1
        cost = llm.drain.step_cost()
        assert stats["first_token_s_by_tier"]["interactive"] >= 2 * cost.step_s(1) > 0
        with pytest.raises(QueueFullError) as caught:
            await anext(engine.generate(prompt(3), SHORT, priority="interactive"))
        assert (caught.value.tier, caught.value.reason) == ("interactive", "queue_wait")
        assert caught.value.retry_after_s >= 1
        assert engine.stats()["num_waiting"] == 0 and llm.prompt_tokens_total == 2 * PROMPT + 3
        batch = [d async for d in engine.generate(prompt(4), SHORT, priority="batch")]
        assert batch[-1].finished
        await holder.aclose()
    finally:
        await engine.shutdown()

"""AsyncEngine: streaming, concurrency, aborts (explicit, by closing, by cancelling), failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from regional_node.engine import (
    AsyncEngine,
    EngineError,
    InvalidRequestError,
    LLMEngine,
    RequestDelta,
    SamplingParams,
)
from tests.engine.checkpoints import hf_greedy, random_prompts

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)


@pytest.fixture
async def engine(llama_dir: Path) -> AsyncIterator[AsyncEngine]:
    engine = AsyncEngine(LLMEngine.from_pretrained(llama_dir, block_size=4, num_kv_blocks=200))
    await engine.start()
    yield engine
    await engine.shutdown()


async def collect(stream: AsyncIterator[RequestDelta]) -> list[RequestDelta]:
    return [delta async for delta in stream]


async def wait_until_idle(engine: AsyncEngine) -> dict:
    for _ in range(500):
        stats = engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_blocks_used"] == 0:
            return stats
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not free its requests: {engine.stats()}")


async def test_streams_one_delta_per_token_with_matching_tokens(engine: AsyncEngine, llama_dir: Path) -> None:
    prompt = random_prompts([9], seed=20)[0]
    deltas = await collect(engine.generate(prompt, GREEDY))
    assert [len(d.new_token_ids) for d in deltas] == [1] * 12
    assert [d.finished for d in deltas] == [False] * 11 + [True]
    assert deltas[-1].finish_reason == "length" and deltas[-1].num_output_tokens == 12
    assert [t for d in deltas for t in d.new_token_ids] == hf_greedy(llama_dir, prompt, 12)
    assert deltas[0].prompt_tokens == 9


async def test_first_delta_reports_queue_and_prefill_time(engine: AsyncEngine) -> None:
    deltas = await collect(engine.generate(random_prompts([30], seed=21)[0], GREEDY))
    first, rest = deltas[0], deltas[1:]
    assert first.queue_time_s is not None and first.queue_time_s >= 0
    assert first.prefill_time_s is not None and first.prefill_time_s > 0
    assert all(d.queue_time_s is None and d.prefill_time_s is None for d in rest)


async def test_concurrent_requests(engine: AsyncEngine, llama_dir: Path) -> None:
    prompts = random_prompts([3, 17, 40, 8, 25], seed=21)
    results = await asyncio.gather(
        *(collect(engine.generate(p, GREEDY, tenant=f"t{i % 2}")) for i, p in enumerate(prompts))
    )
    for prompt, deltas in zip(prompts, results, strict=True):
        assert [t for d in deltas for t in d.new_token_ids] == hf_greedy(llama_dir, prompt, 12)
    await wait_until_idle(engine)


async def test_validation_error_raises_before_any_delta(engine: AsyncEngine) -> None:
    with pytest.raises(InvalidRequestError) as err:
        await collect(engine.generate([1, 2], SamplingParams(max_tokens=0)))
    assert err.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError, match="empty"):
        await collect(engine.generate([], GREEDY))
    assert len(await collect(engine.generate([1, 2], GREEDY))) == 12


async def test_abort_ends_stream_and_frees_blocks(engine: AsyncEngine) -> None:
    stream = engine.generate([1, 2, 3, 4, 5], LONG, request_id="victim")
    first = await anext(stream)
    assert not first.finished
    assert engine.stats()["kv_blocks_used"] > 0
    await engine.abort("victim")
    rest = [d async for d in stream]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert len(rest) < 299
    await wait_until_idle(engine)


async def test_closing_the_iterator_aborts_the_request(engine: AsyncEngine) -> None:
    stream = engine.generate([1, 2, 3, 4, 5], LONG)
    async for _ in stream:
        break
    await stream.aclose()
    stats = await wait_until_idle(engine)
    assert stats["generation_tokens_total"] < 300


async def test_cancelling_the_consumer_aborts_the_request(engine: AsyncEngine) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate([7, 8, 9], LONG):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = await wait_until_idle(engine)
    assert stats["generation_tokens_total"] < 300


async def test_continuation_tokens_count_as_prompt(engine: AsyncEngine, llama_dir: Path) -> None:
    prompt, carried = [4, 5, 6], [7, 8]
    deltas = await collect(engine.generate(prompt, GREEDY, continuation_token_ids=carried))
    assert deltas[0].prompt_tokens == 5
    assert [t for d in deltas for t in d.new_token_ids] == hf_greedy(llama_dir, prompt + carried, 12)


async def test_carried_tokens_that_end_the_request_give_one_finished_delta_and_hold_nothing(
    engine: AsyncEngine,
) -> None:
    prompt, carried = [4, 5, 6], [7, 8]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=[8])
    [delta] = await collect(engine.generate(prompt, params, continuation_token_ids=carried))
    assert (delta.finished, delta.finish_reason, delta.new_token_ids, delta.new_text) == (
        True,
        "stop",
        [],
        "",
    )
    assert (delta.prompt_tokens, delta.num_output_tokens) == (5, 0)
    stats = await wait_until_idle(engine)
    assert stats["generation_tokens_total"] == 0 and stats["prompt_tokens_total"] == 0


async def test_failing_step_fails_its_requests_and_engine_recovers(engine: AsyncEngine) -> None:
    runner = engine.engine.runner
    original = runner.execute

    def broken(*args: object, **kwargs: object) -> object:
        runner.execute = original  # type: ignore[method-assign]
        raise RuntimeError("device fell over")

    runner.execute = broken  # type: ignore[method-assign]
    with pytest.raises(EngineError, match="device fell over"):
        await collect(engine.generate([1, 2, 3], GREEDY))
    await wait_until_idle(engine)
    assert len(await collect(engine.generate([1, 2, 3], GREEDY))) == 12


async def test_explicit_abort_ends_stream_even_when_the_next_step_crashes(engine: AsyncEngine) -> None:
    inner = engine.engine
    original_abort, original_schedule = inner.abort_request, inner.scheduler.schedule

    def crash_once() -> object:
        inner.scheduler.schedule = original_schedule  # type: ignore[method-assign]
        raise RuntimeError("scheduler bug")

    def abort_then_crash(request_id: str) -> None:
        original_abort(request_id)
        inner.scheduler.schedule = crash_once  # type: ignore[method-assign]

    stream = engine.generate([1, 2, 3, 4, 5], LONG, request_id="victim")
    await anext(stream)
    inner.abort_request = abort_then_crash  # type: ignore[method-assign]
    try:
        await engine.abort("victim")
        with pytest.raises(EngineError, match="scheduler bug"):
            await asyncio.wait_for(collect(stream), timeout=10)
    finally:
        inner.abort_request = original_abort  # type: ignore[method-assign]
    await wait_until_idle(engine)


async def test_shutdown_fails_open_streams(llama_dir: Path) -> None:
    engine = AsyncEngine(LLMEngine.from_pretrained(llama_dir))
    await engine.start()
    stream = engine.generate([1, 2, 3], LONG)
    await anext(stream)
    await engine.shutdown()
    with pytest.raises(EngineError, match="shutting down"):
        async for _ in stream:
            pass


async def test_generate_before_start_is_an_error(llama_dir: Path) -> None:
    engine = AsyncEngine(LLMEngine.from_pretrained(llama_dir))
    with pytest.raises(EngineError, match="start"):
        await collect(engine.generate([1], GREEDY))


async def test_many_streams_with_random_disconnects_leak_nothing(engine: AsyncEngine) -> None:
    prompts = random_prompts([5 + (i * 7) % 40 for i in range(24)], seed=22)

    async def client(i: int, prompt: list[int]) -> int:
        stream = engine.generate(
            prompt,
            SamplingParams(max_tokens=20, temperature=0.7, seed=i, ignore_eos=True),
            tenant=f"t{i % 3}",
        )
        received = 0
        async for _ in stream:
            received += 1
            if i % 3 == 0 and received == 1 + i % 5:
                await stream.aclose()  # a client that goes away mid-stream
                break
        return received

    received = await asyncio.gather(*(client(i, p) for i, p in enumerate(prompts)))
    assert all(n == 20 for i, n in enumerate(received) if i % 3)
    await wait_until_idle(engine)

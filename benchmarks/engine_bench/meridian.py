"""Runs a workload on our LLMEngine, stepping it by hand so every token gets a timestamp."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine_bench.result import RunResult
from engine_bench.timing import TokenTimes
from engine_bench.workload import BenchRequest
from regional_node.engine import LLMEngine, SamplingParams


def load_engine(
    checkpoint: Path, *, device: str, dtype: str, enable_prefix_caching: bool, **options: Any
) -> LLMEngine:
    return LLMEngine.from_pretrained(
        checkpoint, device=device, dtype=dtype, enable_prefix_caching=enable_prefix_caching, **options
    )


def run_meridian(engine: LLMEngine, requests: list[BenchRequest], *, warmup_prompt: list[int]) -> RunResult:
    """All requests are added at t=0; the clock includes add_request and every step()."""
    # Untimed: first-call allocations, and for the prefix scenario a system prompt already cached
    # by earlier traffic, which is the steady state a chat deployment runs in.
    engine.generate([warmup_prompt], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))

    timelines = {r.request_id: TokenTimes(r.request_id) for r in requests}
    output_ids: dict[str, list[int]] = {r.request_id: [] for r in requests}
    cached_tokens: dict[str, int] = {}
    started, cpu_started = time.perf_counter(), time.process_time()
    for r in requests:
        # Token ids are all a benchmark reads: no logprobs, as the engines it is compared with.
        params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True, logprobs=False)
        engine.add_request(r.request_id, list(r.prompt_ids), params)
    remaining, steps = len(requests), 0
    while remaining:
        deltas = engine.step()
        steps += 1
        now = time.perf_counter() - started
        for delta in deltas:
            timelines[delta.request_id].times.extend([now] * len(delta.new_token_ids))
            output_ids[delta.request_id].extend(delta.new_token_ids)
            if delta.finished:
                remaining -= 1
                cached_tokens[delta.request_id] = delta.cached_tokens
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    details = {
        "steps": steps,
        "cached_prompt_tokens": sum(cached_tokens.values()),
        "engine_options": {
            key: getattr(engine.engine_config, key)
            for key in ("block_size", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching")
        },
    }
    return RunResult(list(timelines.values()), wall, cpu, output_ids, details)

"""The two transformers baselines: static padded batches (`generate`) and its continuous batching.

transformers is the benchmark's baseline only (a test dependency), never imported at runtime.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from engine_bench.result import RunResult
from engine_bench.timing import TokenTimes
from engine_bench.workload import BenchRequest

PAD_ID = 0  # <|endoftext|>; padded positions are masked out


def load_hf_model(checkpoint: Path, *, device: str, dtype: str) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=getattr(torch, dtype), attn_implementation="sdpa"
    )
    # EOS never ends a run: every system generates exactly max_tokens per request.
    model.generation_config.eos_token_id = None
    return model.to(device).eval()


class _StepClock:
    """A `generate` streamer: its first put() is the prompt, each later one is one decode step."""

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if self._seen_prompt:
            self.step_times.append(time.perf_counter())
        self._seen_prompt = True

    def end(self) -> None:
        pass


def _greedy_config(max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=PAD_ID
    )


def run_static_batches(model: PreTrainedModel, requests: list[BenchRequest], *, batch_size: int) -> RunResult:
    """Batches in arrival order, left-padded; each runs to its longest request's max_tokens.

    Only each request's own max_tokens count as output; a request's tokens are timestamped by the
    decode steps of its batch, so its TTFT includes waiting for every earlier batch.
    """
    device = model.device
    warmup = torch.tensor([[5, 6, 7, 8]], device=device)
    model.generate(warmup, generation_config=_greedy_config(2))
    timelines, output_ids = [], {}
    started, cpu_started = time.perf_counter(), time.process_time()
    padded_tokens = 0
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        longest_prompt = max(len(r.prompt_ids) for r in batch)
        longest_output = max(r.max_tokens for r in batch)
        ids = torch.full((len(batch), longest_prompt), PAD_ID, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(batch):
            ids[row, longest_prompt - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[row, longest_prompt - len(r.prompt_ids) :] = 1
        clock = _StepClock()
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=_greedy_config(longest_output),
                streamer=clock,
            )
        assert out.shape[1] == longest_prompt + longest_output, "generation stopped early"
        padded_tokens += len(batch) * longest_output
        for row, r in enumerate(batch):
            times = [t - started for t in clock.step_times[: r.max_tokens]]
            timelines.append(TokenTimes(r.request_id, times))
            output_ids[r.request_id] = out[row, longest_prompt : longest_prompt + r.max_tokens].tolist()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    details = {"batch_size": batch_size, "generated_tokens_including_padding": padded_tokens}
    return RunResult(timelines, wall, cpu, output_ids, details)


def run_continuous_batching(
    model: PreTrainedModel,
    requests: list[BenchRequest],
    *,
    max_batch_tokens: int,
    max_requests_per_batch: int,
) -> RunResult:
    """transformers' continuous batching, with each request's own max_new_tokens.

    `generate_batch(inputs, generation_config)` takes one max_new_tokens for the whole call, so this
    drives the same manager `generate_batch` runs on (`continuous_batching_context_manager`) and adds
    requests one by one, as `generate_batch` does, passing max_new_tokens per request; streaming
    with record_timestamps gives each token's time.
    """
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)  # psutil complaints on CPU
    page_size = 256  # transformers' default
    total_tokens = sum(len(r.prompt_ids) + r.max_tokens for r in requests)
    cb_config = ContinuousBatchingConfig(
        page_size=page_size,
        # Room for every request at once plus one spare page each, so no system is memory bound.
        num_blocks=math.ceil(total_tokens / page_size) + len(requests) + 1,
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_requests_per_batch,
    )
    model.generate_batch(
        inputs=[[5, 6, 7, 8]], generation_config=_greedy_config(2), continuous_batching_config=cb_config
    )
    timelines: dict[str, TokenTimes] = {}
    output_ids: dict[str, list[int]] = {}
    with model.continuous_batching_context_manager(
        generation_config=_greedy_config(max(r.max_tokens for r in requests)),
        continuous_batching_config=cb_config,
        block=True,
        timeout=30,
    ) as manager:
        started, cpu_started = time.perf_counter(), time.process_time()
        for r in requests:
            manager.add_request(
                list(r.prompt_ids),
                request_id=r.request_id,
                max_new_tokens=r.max_tokens,
                record_timestamps=True,
                eos_token_id=-1,
            )
        while len(output_ids) < len(requests):
            result = manager.get_result(timeout=60)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped")
                continue
            if result.error is not None:
                raise RuntimeError(f"transformers' continuous batching failed: {result.error}")
            if result.is_finished():
                output_ids[result.request_id] = list(result.generated_tokens)
                times = [t - started for t in result.timestamps or []]
                timelines[result.request_id] = TokenTimes(result.request_id, times)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    details = {
        "page_size": page_size,
        "num_blocks": cb_config.num_blocks,
        "max_batch_tokens": max_batch_tokens,
        "max_requests_per_batch": max_requests_per_batch,
        "attn_implementation": "sdpa",
    }
    ordered = [timelines[r.request_id] for r in requests]
    return RunResult(ordered, wall, cpu, output_ids, details)

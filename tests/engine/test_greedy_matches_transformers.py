"""With greedy sampling the engine's tokens equal transformers' (one prompt at a time, no padding),
under any batching, chunking, preemption or prefix-cache state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from regional_node.engine import LLMEngine, SamplingParams
from tests.engine.checkpoints import hf_greedy, random_prompts, write_checkpoint

# The reference has no EOS; the engine also stops at the tokenizer's eos_token unless told not to.
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
LENGTHS = [1, 5, 16, 17, 33, 70, 8, 129]


def check(engine: LLMEngine, path: Path, prompts: list[list[int]], params: SamplingParams = GREEDY) -> None:
    results = engine.generate(prompts, params)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_token_ids == hf_greedy(path, prompt, params.max_tokens)
        assert result.finish_reason == "length"
        assert result.prompt_tokens == len(prompt)
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_mixed_prompt_lengths_in_one_batch(model_dir: Path, prefix_caching: bool) -> None:
    engine = LLMEngine.from_pretrained(model_dir, enable_prefix_caching=prefix_caching)
    check(engine, model_dir, random_prompts(LENGTHS))


def test_a_long_step_goes_through_the_mlp_in_slices(model_dir: Path) -> None:
    """On CPU a step with more rows than `mlp_rows` takes the MLP slice by slice (to stay under
    malloc's mmap threshold); the tokens stay exactly transformers'."""
    engine = LLMEngine.from_pretrained(model_dir)
    model = engine.runner.model
    assert model.mlp_rows is not None and model.mlp_rows >= 2048  # the test model's activations are small
    model.mlp_rows = 5
    rows: list[int] = []

    def recording(gate_up: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(x: torch.Tensor) -> torch.Tensor:
            rows.append(x.shape[0])
            return gate_up(x)

        return run

    model.linears = [dataclasses.replace(lin, gate_up=recording(lin.gate_up)) for lin in model.linears]
    check(engine, model_dir, random_prompts(LENGTHS))
    assert max(rows) == 5 and rows.count(5) > len(model.linears)


def test_tiny_pool_forces_preemption(model_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(model_dir, num_kv_blocks=14, block_size=8)
    check(engine, model_dir, random_prompts([20, 40, 9, 60, 30, 25], seed=1))
    assert engine.stats()["num_preemptions"] > 0


def test_small_token_budget_chunks_prefills(model_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(model_dir, max_num_batched_tokens=7, block_size=4)
    check(engine, model_dir, random_prompts([50, 3, 23, 90], seed=2))


def test_requests_arriving_while_others_decode(llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(llama_dir, max_num_batched_tokens=16, block_size=4)
    prompts = random_prompts([12, 40, 7, 65, 3], seed=3)
    tokens: dict[str, list[int]] = {}
    arrival_steps = {0: [0], 3: [1, 2], 7: [3], 11: [4]}
    step = 0
    while step <= 11 or engine.has_unfinished_requests():
        for i in arrival_steps.get(step, []):
            engine.add_request(f"r{i}", prompts[i], GREEDY)
            tokens[f"r{i}"] = []
        for delta in engine.step():
            tokens[delta.request_id] += delta.new_token_ids
        step += 1
    for i, prompt in enumerate(prompts):
        assert tokens[f"r{i}"] == hf_greedy(llama_dir, prompt, GREEDY.max_tokens)


def test_partial_prefills_start_a_cached_prompt_beside_a_cold_one_with_tokens_unchanged(
    llama_dir: Path,
) -> None:
    """long_prefill_token_threshold=8: the cold 120-token prompt is prefilled 8 tokens a step; a
    request whose 64-token prefix is cached arrives after its first chunk and has its first token
    long before the cold prompt has its own. Every output still equals transformers'."""
    engine = LLMEngine.from_pretrained(llama_dir, block_size=4, long_prefill_token_threshold=8)
    shared, cold, tails = (
        random_prompts([64], seed=7)[0],
        random_prompts([120], seed=8)[0],
        random_prompts([3], seed=9),
    )
    engine.generate([shared + tails[0]], GREEDY)
    engine.add_request("cold", cold, GREEDY)
    first_token_step: dict[str, int] = {}
    tokens: dict[str, list[int]] = {"cold": [], "warm": []}
    for step in range(200):
        if step == 1:
            engine.add_request("warm", shared + tails[0][:2], GREEDY)
        for delta in engine.step():
            if delta.new_token_ids:
                first_token_step.setdefault(delta.request_id, step)
            tokens[delta.request_id] += delta.new_token_ids
        if not engine.has_unfinished_requests():
            break
    assert first_token_step["warm"] <= 3 < 14 <= first_token_step["cold"]
    assert tokens["cold"] == hf_greedy(llama_dir, cold, GREEDY.max_tokens)
    assert tokens["warm"] == hf_greedy(llama_dir, shared + tails[0][:2], GREEDY.max_tokens)
    assert engine.stats()["kv_blocks_used"] == 0


def test_prefix_cache_hits_keep_tokens_identical(model_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(model_dir, block_size=8)
    shared = random_prompts([64], seed=4)[0]
    tails = random_prompts([5, 11, 1], seed=5)
    first = engine.generate([shared + tails[0]], GREEDY)[0]
    assert first.cached_tokens == 0
    prompts = [shared + t for t in tails]
    results = engine.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_token_ids == hf_greedy(model_dir, prompt, GREEDY.max_tokens)
    assert results[0].cached_tokens == 64
    stats = engine.stats()
    assert stats["prefix_cache_hit_tokens"] >= 3 * 64
    assert 0 < stats["prefix_cache_hit_rate"] < 1


def test_same_prompt_twice_reuses_all_but_the_last_token(llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(llama_dir, block_size=4)
    prompt = random_prompts([40], seed=6)[0]
    before = engine.stats()["prefix_cache_hit_tokens"]
    a = engine.generate([prompt], GREEDY)[0]
    b = engine.generate([prompt], GREEDY)[0]
    assert b.cached_tokens == 36  # 10 full blocks, the last one recomputed to get logits
    assert engine.stats()["prefix_cache_hit_tokens"] - before == 36
    assert a.output_token_ids == b.output_token_ids == hf_greedy(llama_dir, prompt, GREEDY.max_tokens)


@pytest.mark.parametrize(
    "variant",
    [
        {"arch": "llama", "num_kv_heads": 4, "attention_bias": True, "tied": True},
        {
            "arch": "llama",
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        {"arch": "llama", "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 5000.0},
        {"arch": "qwen2", "num_kv_heads": 1, "tied": False, "head_dim": 32},
    ],
    ids=["mha-bias-tied", "llama3-rope", "linear-rope", "qwen2-mqa-untied-headdim"],
)
def test_architecture_variants(tmp_path: Path, variant: dict) -> None:
    path = write_checkpoint(tmp_path, tokenizer=False, seed=7, **variant)
    engine = LLMEngine.from_pretrained(path, block_size=8, max_num_batched_tokens=32)
    check(
        engine,
        path,
        random_prompts([3, 30, 75], seed=8),
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
    )


def test_stop_token_ends_output_where_transformers_would(llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(llama_dir)
    prompt = random_prompts([10], seed=9)[0]
    reference = hf_greedy(llama_dir, prompt, 24)
    stop = reference[6]
    params = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=[stop], ignore_eos=True)
    result = engine.generate([prompt], params)[0]
    assert result.output_token_ids == reference[: reference.index(stop) + 1]
    assert result.finish_reason == "stop"


@pytest.mark.parametrize("fixture", ["llama_checkpoint", "qwen2_checkpoint"])
def test_project_checkpoints_match_until_eos(fixture: str, request: pytest.FixtureRequest) -> None:
    """The checkpoints `meridian model init` writes (tokenizer, chat template, EOS in generation_config)."""
    path: Path = request.getfixturevalue(fixture)
    engine = LLMEngine.from_pretrained(path, max_num_batched_tokens=64)
    tok = engine.tokenizer
    assert tok is not None and tok.eos_token_ids
    chats = [[{"role": "user", "content": text}] for text in ("hello there", "tell me a story", "2 + 2 =")]
    prompts = [tok.apply_chat_template(chat) for chat in chats] + random_prompts([40, 7], seed=30)
    params = SamplingParams(max_tokens=40, temperature=0.0)
    for prompt, result in zip(prompts, engine.generate(prompts, params), strict=True):
        expected = hf_greedy(path, prompt, 40, stop_at_eos=True)
        assert result.output_token_ids == expected
        assert result.finish_reason == ("stop" if expected[-1] in tok.eos_token_ids else "length")
        assert result.text == tok.decode(expected)


def test_cache_salt_isolates_tenants(llama_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(llama_dir, block_size=4)
    prompt = random_prompts([33], seed=31)[0]

    def run(salt: str | None) -> int:
        engine.add_request(
            f"r-{salt}-{engine.stats()['prompt_tokens_total']}", prompt, GREEDY, cache_salt=salt
        )
        cached = 0
        while engine.has_unfinished_requests():
            for delta in engine.step():
                cached = delta.cached_tokens
        return cached

    assert run("tenant-a") == 0
    assert run("tenant-b") == 0  # same tokens, other salt: no reuse
    assert run("tenant-a") == 32
    assert run(None) == 0

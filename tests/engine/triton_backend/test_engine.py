"""The engine with attention_backend "triton" (kernels in Triton's CPU interpreter) gives
transformers' greedy tokens, and decode steps served from the CUDA-graph buffers (padded to a
captured batch size, run eagerly here) give the same logits as plain eager steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from regional_node.engine import LLMEngine, SamplingParams, attention
from regional_node.engine.cuda_graphs import DecodeGraphs
from regional_node.engine.errors import EngineConfigError
from regional_node.engine.model_runner import flatten_step
from tests.engine.checkpoints import hf_greedy, random_prompts
from tests.engine.triton_backend.conftest import needs_triton

pytestmark = needs_triton

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def triton_engine(path: Path, **options: object) -> LLMEngine:
    return LLMEngine.from_pretrained(path, attention_backend="triton", **options)


def check(engine: LLMEngine, path: Path, prompts: list[list[int]]) -> list[int]:
    results = engine.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_token_ids == hf_greedy(path, prompt, GREEDY.max_tokens)
    assert engine.stats()["kv_blocks_used"] == 0
    return [r.cached_tokens for r in results]


def test_chunked_prefill_and_prefix_cache_hits_give_transformers_tokens(model_dir: Path) -> None:
    """Llama (GQA) and Qwen2 (q/k/v biases, tied embeddings); a 24-token budget splits prompts into
    chunks that attend to their earlier chunks through the cache."""
    engine = triton_engine(model_dir, block_size=8, max_num_batched_tokens=24)
    prompts = random_prompts([5, 17, 40], seed=40)
    assert check(engine, model_dir, prompts) == [0, 0, 0]
    again = [prompts[2] + [7, 8, 9], prompts[0]]
    assert check(engine, model_dir, again) == [40, 0]


def test_preemption_and_recomputation_give_transformers_tokens(llama_dir: Path) -> None:
    engine = triton_engine(llama_dir, block_size=4, num_kv_blocks=10)
    check(engine, llama_dir, random_prompts([12, 12, 12], seed=41))
    assert engine.stats()["num_preemptions"] > 0


def test_padded_decode_step_gives_the_eager_logits_for_its_real_rows(llama_dir: Path) -> None:
    engine = triton_engine(llama_dir, block_size=8)
    for i, prompt in enumerate(random_prompts([30, 3, 12], seed=42)):
        engine.add_request(f"r{i}", prompt, GREEDY)
    engine.step()  # every prompt prefilled at once; next comes a step of three decodes
    chunks = engine.scheduler.schedule().chunks
    step = flatten_step(chunks, [None] * len(chunks), 8)
    assert not step.layout.prefills and step.layout.num_tokens == 3
    runner = engine.runner
    with torch.inference_mode():
        eager = runner.model.forward(
            torch.tensor(step.input_ids),
            torch.tensor(step.positions),
            runner.kv_caches,
            runner.backend,
            runner.backend.prepare(step.layout, 8, runner.device),
            torch.arange(3),
        )
        graphs = DecodeGraphs(
            runner.model,
            runner.backend,
            runner.kv_caches,
            block_size=8,
            max_num_seqs=4,
            max_blocks_per_seq=64,
        )
        assert graphs.sizes == [1, 2, 4]
        padded = graphs.run(step.input_ids, step.positions, step.layout)  # three real rows, one padding
    assert padded is not None
    # Equal up to float32 summation order (the matmuls see 4 rows instead of 3).
    torch.testing.assert_close(padded, eager, atol=1e-4, rtol=1e-5)
    assert torch.equal(padded.argmax(dim=-1), eager.argmax(dim=-1))
    assert graphs.run([0] * 5, [0] * 5, step.layout) is None  # above the largest size: eager instead


def test_engine_serving_decodes_from_graph_buffers_gives_transformers_tokens(llama_dir: Path) -> None:
    """Six sequences, buffers for four: steps with prefill or more than four decodes run eagerly,
    the rest padded to 1, 2 or 4 sequences through the buffers."""
    engine = triton_engine(llama_dir, block_size=8, max_num_batched_tokens=16)
    engine.runner.use_decode_graphs(max_num_seqs=4, max_blocks_per_seq=64, capture=False)
    check(engine, llama_dir, random_prompts([3, 11, 6, 25, 2, 9], seed=43))


def test_triton_on_cpu_without_the_interpreter_is_a_config_error(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regional_node.engine.attention import triton_kernels

    monkeypatch.setattr(triton_kernels, "INTERPRETED", False)
    with pytest.raises(EngineConfigError, match="needs a CUDA device"):
        triton_engine(llama_dir)


def test_triton_not_installed_is_a_config_error(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a machine without the package: importing triton fails, and the backend's modules are
    # imported afresh (monkeypatch puts every module back afterwards).
    monkeypatch.setitem(sys.modules, "triton", None)
    for name in ("triton_backend", "triton_kernels"):
        monkeypatch.delitem(sys.modules, f"{attention.__name__}.{name}", raising=False)
        monkeypatch.delattr(attention, name, raising=False)
    with pytest.raises(EngineConfigError, match="needs the triton package"):
        triton_engine(llama_dir)


def test_bfloat16_end_to_end_gives_the_torch_backends_bfloat16_tokens(llama_dir: Path) -> None:
    """Weights, KV cache and attention in bfloat16 (float32 is what matches transformers exactly)."""
    prompts = random_prompts([5, 17, 40], seed=44)
    tokens = {}
    for backend in ("torch", "triton"):
        engine = LLMEngine.from_pretrained(
            llama_dir, attention_backend=backend, dtype="bfloat16", block_size=8, max_num_batched_tokens=24
        )
        assert engine.runner.model.layers[0].qkv.dtype == torch.bfloat16
        assert engine.runner.kv_caches[0][0].dtype == torch.bfloat16
        tokens[backend] = [r.output_token_ids for r in engine.generate(prompts, GREEDY)]
    assert tokens["triton"] == tokens["torch"]

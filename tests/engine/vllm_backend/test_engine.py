"""The engine on vLLM's CPU attention kernels (attention_backend "vllm") gives transformers' greedy
tokens under batching, chunked prefill, preemption and prefix-cache hits, exactly as the torch
backend does; "auto" picks it wherever its kernels fit the cache shape."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from regional_node.engine import LLMEngine, SamplingParams
from regional_node.engine.errors import EngineConfigError
from tests.engine.checkpoints import hf_greedy, random_prompts
from tests.engine.vllm_backend.conftest import needs_vllm

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
BACKENDS = ["torch", pytest.param("vllm", marks=needs_vllm)]


def check(engine: LLMEngine, path: Path, prompts: list[list[int]]) -> list[int]:
    results = engine.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_token_ids == hf_greedy(path, prompt, GREEDY.max_tokens)
        assert result.finish_reason == "length"
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0
    return [r.cached_tokens for r in results]


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_prompt_lengths_in_one_batch(model32_dir: Path, backend: str) -> None:
    engine = LLMEngine.from_pretrained(model32_dir, attention_backend=backend)
    assert engine.runner.backend.name == backend
    check(engine, model32_dir, random_prompts([1, 5, 16, 17, 33, 70, 8, 129], seed=50))


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_and_prefix_cache_hits(model32_dir: Path, backend: str) -> None:
    """A 24-token budget splits prompts into chunks that attend to their earlier chunks through the
    cache; the second round reuses the first round's full blocks."""
    engine = LLMEngine.from_pretrained(model32_dir, attention_backend=backend, max_num_batched_tokens=24)
    prompts = random_prompts([5, 17, 40, 70], seed=51)
    assert check(engine, model32_dir, prompts) == [0, 0, 0, 0]
    again = [prompts[3] + [7, 8, 9], prompts[2][:33], prompts[0]]
    assert check(engine, model32_dir, again) == [64, 32, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_preemption_and_recomputation(model32_dir: Path, backend: str) -> None:
    engine = LLMEngine.from_pretrained(model32_dir, attention_backend=backend, num_kv_blocks=8)
    check(engine, model32_dir, random_prompts([30, 40, 9, 35, 20], seed=52))
    assert engine.stats()["num_preemptions"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_requests_arriving_while_others_decode(llama32_dir: Path, backend: str) -> None:
    engine = LLMEngine.from_pretrained(llama32_dir, attention_backend=backend, max_num_batched_tokens=16)
    prompts = random_prompts([12, 40, 7, 65, 3], seed=53)
    tokens: dict[str, list[int]] = {}
    arrivals = {0: [0], 3: [1, 2], 7: [3], 11: [4]}
    step = 0
    while step <= 11 or engine.has_unfinished_requests():
        for i in arrivals.get(step, []):
            engine.add_request(f"r{i}", prompts[i], GREEDY)
            tokens[f"r{i}"] = []
        for delta in engine.step():
            tokens[delta.request_id] += delta.new_token_ids
        step += 1
    for i, prompt in enumerate(prompts):
        assert tokens[f"r{i}"] == hf_greedy(llama32_dir, prompt, GREEDY.max_tokens)


@needs_vllm
def test_bfloat16_weights_and_cache(llama32_dir: Path) -> None:
    """bfloat16 runs end to end on vLLM's kernels (float32 is what matches transformers exactly)."""
    engine = LLMEngine.from_pretrained(llama32_dir, attention_backend="vllm", dtype="bfloat16")
    assert engine.runner.kv_caches[0][0].dtype == torch.bfloat16
    results = engine.generate(random_prompts([5, 40], seed=54), GREEDY)
    assert [len(r.output_token_ids) for r in results] == [16, 16]


@needs_vllm
def test_auto_picks_vllm_where_its_kernels_fit(llama32_dir: Path) -> None:
    assert LLMEngine.from_pretrained(llama32_dir, attention_backend="auto").runner.backend.name == "vllm"
    # vLLM's CPU kernels need blocks of a multiple of 16 tokens: auto falls back to torch ...
    engine = LLMEngine.from_pretrained(llama32_dir, attention_backend="auto", block_size=8)
    assert engine.runner.backend.name == "torch"


@needs_vllm
def test_auto_falls_back_to_torch_for_head_sizes_vllm_lacks(llama_dir: Path) -> None:
    assert LLMEngine.from_pretrained(llama_dir, attention_backend="auto").runner.backend.name == "torch"


@needs_vllm
@pytest.mark.parametrize(
    ("fixture", "options", "message"),
    [
        ("llama32_dir", {"block_size": 8}, "block_size a multiple of 16"),
        ("llama_dir", {}, "head sizes 32, 64"),
    ],
)
def test_vllm_backend_refuses_shapes_its_kernels_lack(
    fixture: str, options: dict, message: str, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(fixture)
    with pytest.raises(EngineConfigError, match=message):
        LLMEngine.from_pretrained(path, attention_backend="vllm", **options)


def test_vllm_not_installed_is_a_config_error_and_auto_uses_torch(
    llama32_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a machine without the package: importing vllm fails (monkeypatch restores sys.modules).
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(EngineConfigError, match=r"needs vLLM, which is not installed"):
        LLMEngine.from_pretrained(llama32_dir, attention_backend="vllm")
    assert LLMEngine.from_pretrained(llama32_dir, attention_backend="auto").runner.backend.name == "torch"


@needs_vllm
def test_the_vllm_backend_runs_the_dense_ops_on_vllms_cpu_kernels(model32_dir: Path) -> None:
    """Greedy equality with transformers is checked above on this path; here: it is the path, and
    each kernel agrees with torch's op (strided inputs and bfloat16 included)."""
    from regional_node.engine.attention.vllm_backend import cpu_kernels
    from regional_node.engine.models.llama import torch_add_rms_norm
    from regional_node.engine.models.rope import TorchRope

    engine = LLMEngine.from_pretrained(model32_dir, attention_backend="vllm")
    model = engine.runner.model
    kernels = cpu_kernels(torch.device("cpu"))
    assert kernels is not None and model.kernels.add_rms_norm.__module__ == kernels.add_rms_norm.__module__
    assert "_onednn_linear" in model.linears[0].qkv.__qualname__  # not torch's F.linear
    generator = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(48, 32, generator=generator), torch.randn(48, generator=generator)
    rows = torch.randn(5, 64, generator=generator)[:, :32]  # strided, as a chunk of gate_up is
    residual, delta = torch.randn(5, 32, generator=generator), torch.randn(5, 32, generator=generator)
    for dtype in (torch.float32, torch.bfloat16):  # bfloat16: oneDNN's or, without a kernel, torch's
        w, b, x = weight.to(dtype), bias.to(dtype), rows.to(dtype)
        torch.testing.assert_close(kernels.linear(w, b)(x), torch.nn.functional.linear(x, w, b))
    norm_w = torch.rand(32, generator=generator)
    for d in (None, delta):
        got = kernels.add_rms_norm(None if d is None else d.clone(), residual.clone(), norm_w, 1e-6)
        want = torch_add_rms_norm(d, residual, norm_w, 1e-6)
        torch.testing.assert_close(got, want)
    # Rotary: on q and k inside the qkv rows (v untouched), v bit for bit; q/k as torch's to float32
    # rounding (bit-equal with vLLM's AVX2 build, last-bit differences where AVX-512 fuses the FMAs).
    heads, kv_heads, head_dim = 4, 2, 32
    positions = torch.tensor([0, 7, 3, 200, 41])
    cos, sin = model.cos, model.sin  # the model's own tables (head_dim 32 too)
    assert model.cos.shape[-1] == head_dim and model.rope.__class__.__name__ == "_VllmRope"
    qkv = torch.randn(5, (heads + 2 * kv_heads) * head_dim, generator=generator)
    qk_width = (heads + kv_heads) * head_dim
    want = TorchRope(cos, sin).at(positions)(qkv[:, :qk_width].view(5, -1, head_dim), heads)
    rotated = qkv.clone()
    qk = rotated[:, :qk_width].view(5, -1, head_dim)
    assert kernels.rope(cos, sin).at(positions)(qk, heads) is qk
    torch.testing.assert_close(qk, want)
    assert torch.equal(rotated[:, qk_width:], qkv[:, qk_width:])

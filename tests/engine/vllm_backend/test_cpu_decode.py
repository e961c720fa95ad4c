"""Our CPU decode-attention kernel (attention/cpu_decode.cpp) against vLLM's on the same cache:
written by vLLM's own reshape_and_cache, read back through scattered block tables, for every head
size it is built for, grouped-query shapes wider than its register group, block sizes of both of
vLLM's CPU layouts, contexts that end inside, at and just past a block, and both of its work
splits (a task per sequence, a task per KV head). Greedy equality with transformers on this path is
test_engine.py's, whose decode steps run on it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from regional_node.engine import LLMEngine, SamplingParams
from tests.engine.checkpoints import hf_greedy, random_prompts
from tests.engine.vllm_backend.conftest import needs_vllm

pytestmark = needs_vllm


def _vllm_decode(
    ops: Any,
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    isa: str,
) -> torch.Tensor:
    rows = q.shape[0]
    starts = torch.arange(rows + 1, dtype=torch.int32)
    scheduler = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=rows,
        num_heads=q.shape[1],
        num_kv_heads=key_cache.shape[1],
        head_dim=q.shape[2],
        seq_lens=seq_lens,
        dtype=torch.float32,
        query_start_loc=starts,
        causal=True,
        sliding_window_size=-1,
        isa=isa,
        enable_kv_split=True,
    )
    out = torch.empty(q.shape)
    ops.cpu_attention_with_kv_cache(
        query=q,
        key_cache=key_cache,
        value_cache=value_cache,
        output=out,
        query_start_loc=starts,
        seq_lens=seq_lens,
        scale=q.shape[2] ** -0.5,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=block_table,
        softcap=0.0,
        scheduler_metadata=scheduler,
        s_aux=None,
    )
    return out


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [
        (4, 2, 32, 16),  # the engine tests' checkpoints, vLLM's "vec16" layout
        (12, 4, 64, 32),  # the 100M benchmark model, "vec"
        (8, 8, 128, 32),  # no grouping
        (24, 2, 64, 16),  # 12 query heads per KV head: two register groups (8 + 4)
        (14, 2, 128, 64),
    ],
)
@pytest.mark.parametrize("lengths", [[1, 15, 16, 17, 100], [33, 2, 64, 9] * 4])  # per KV head / per sequence
def test_our_decode_kernel_matches_vllms(
    heads: int, kv_heads: int, head_dim: int, block_size: int, lengths: list[int]
) -> None:
    from regional_node.engine.attention.vllm_backend import _cpu_isa, cpu_decode_kernel, import_ops

    ops, kernel = import_ops(), cpu_decode_kernel()
    assert kernel is not None, "the kernel did not build (a C++ compiler and ninja are needed)"
    generator = torch.Generator().manual_seed(heads * head_dim + len(lengths))
    isa = _cpu_isa(torch.float32, block_size, head_dim)
    blocks_each = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks_each) + 3
    cache = torch.zeros(num_blocks, kv_heads, 2 * block_size, head_dim)
    key_cache, value_cache = cache.chunk(2, dim=2)
    # Scattered, as a pool hands them out; block 0 stays unused padding.
    ids = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    tables, slots = [], []
    for n, count in zip(lengths, blocks_each, strict=True):
        table, ids = ids[:count], ids[count:]
        tables.append(table + [0] * (max(blocks_each) - count))
        slots += [table[t // block_size] * block_size + t % block_size for t in range(n)]
    total = len(slots)
    k = torch.randn(total, kv_heads, head_dim, generator=generator)
    v = torch.randn(total, kv_heads, head_dim, generator=generator)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.tensor(slots), isa)
    block_table = torch.tensor(tables, dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    # q as the model hands it over: a view into wider qkv rows (row and head strides, no copy).
    qkv = torch.randn(len(lengths), heads + 2 * kv_heads, head_dim, generator=generator) * 3
    q = qkv[:, :heads]
    ours = torch.full(q.shape, float("nan"))
    kernel.decode_attention(ours, q, key_cache, value_cache, block_table, seq_lens, head_dim**-0.5)
    want = _vllm_decode(ops, q, key_cache, value_cache, block_table, seq_lens, isa)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)
    # And what attention means, from the tokens themselves (softmax(q k^T / sqrt(d)) v per head).
    start = 0
    for row, n in enumerate(lengths):
        keys = k[start : start + n].repeat_interleave(heads // kv_heads, dim=1)
        values = v[start : start + n].repeat_interleave(heads // kv_heads, dim=1)
        weights = torch.softmax(torch.einsum("hd,thd->ht", q[row], keys) * head_dim**-0.5, dim=-1)
        want = torch.einsum("ht,thd->hd", weights, values)
        torch.testing.assert_close(ours[row], want, rtol=1e-4, atol=1e-5)
        start += n


def test_our_decode_kernel_refuses_what_it_was_not_built_for() -> None:
    from regional_node.engine.attention.vllm_backend import cpu_decode_kernel

    kernel = cpu_decode_kernel()
    assert kernel is not None
    cache = torch.zeros(2, 1, 32, 80)
    key_cache, value_cache = cache.chunk(2, dim=2)
    q, lens = torch.zeros(1, 1, 80), torch.ones(1, dtype=torch.int32)
    table = torch.ones(1, 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="head_dim must be 32, 64 or 128"):
        kernel.decode_attention(torch.empty_like(q), q, key_cache, value_cache, table, lens, 1.0)
    with pytest.raises(RuntimeError, match="float32 only"):
        kernel.decode_attention(q.bfloat16(), q.bfloat16(), key_cache, value_cache, table, lens, 1.0)


def test_the_engine_decodes_on_our_kernel_and_without_it_on_vllms(
    llama32_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Float32 decode rows take our kernel; bfloat16 ones, and all of them where the kernel cannot
    be built (here: the build fails), take vLLM's, with a warning saying so."""
    from regional_node.engine.attention import vllm_backend

    float32 = LLMEngine.from_pretrained(llama32_dir, attention_backend="vllm")
    assert float32.runner.backend.decode_kernel is not None
    bf16 = LLMEngine.from_pretrained(llama32_dir, attention_backend="vllm", dtype="bfloat16")
    assert bf16.runner.backend.decode_kernel is None

    def no_compiler(**_: object) -> None:
        raise RuntimeError("Error building extension 'meridian_cpu_decode': g++: not found")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
    vllm_backend.cpu_decode_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=vllm_backend.__name__):
            engine = LLMEngine.from_pretrained(llama32_dir, attention_backend="vllm")
        assert engine.runner.backend.decode_kernel is None
        assert "decode attention stays on vLLM's kernel" in caplog.text
        greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        prompts = random_prompts([9, 40, 3], seed=55)
        for prompt, result in zip(prompts, engine.generate(prompts, greedy), strict=True):
            assert result.output_token_ids == hf_greedy(llama32_dir, prompt, greedy.max_tokens)
    finally:
        vllm_backend.cpu_decode_kernel.cache_clear()  # the next caller loads the built one again

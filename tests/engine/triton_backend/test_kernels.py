"""The Triton kernels (run by Triton's CPU interpreter) against the torch backend, on random paged
layouts: scattered blocks, decodes of mixed context lengths, prefill chunks with and without a
cached prefix, grouped-query heads."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from regional_node.engine.attention.base import PrefillSpan, StepLayout
from regional_node.engine.attention.torch_backend import TorchAttentionBackend
from tests.engine.triton_backend.conftest import needs_triton

pytestmark = needs_triton

CPU = torch.device("cpu")


@dataclass
class Step:
    layout: StepLayout
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cache: tuple[torch.Tensor, torch.Tensor]  # already holds every sequence's cached prefix


def random_step(
    seqs: list[tuple[int, int]],
    *,
    kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Step:
    """seqs: (context_len, query_len) each; query_len 1 is a decode. Blocks are scattered at random
    over a pool with spare blocks, and the whole cache is random, so a kernel that reads a wrong
    block or slot reads wrong numbers."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-c // block_size) + 1 for c, _ in seqs) + 4
    free = torch.randperm(num_blocks, generator=g).tolist()
    layout = StepLayout(num_tokens=0, slot_mapping=[])
    decodes = sorted((s for s in seqs if s[1] == 1), key=lambda s: -s[0])  # as the runner orders them
    for context, query in decodes + [s for s in seqs if s[1] > 1]:
        table = [free.pop() for _ in range(-(-context // block_size))]
        table.append(free.pop())  # reserved beyond the context, as admission does: never read
        if query == 1:
            layout.decode_block_tables.append(table)
            layout.decode_context_lens.append(context)
        else:
            layout.prefills.append(PrefillSpan(layout.num_tokens, query, context, table))
        layout.slot_mapping += [
            table[p // block_size] * block_size + p % block_size for p in range(context - query, context)
        ]
        layout.num_tokens += query
    heads, n = kv_heads * group, layout.num_tokens

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    cache_shape = (kv_heads, num_blocks, block_size, head_dim)
    return Step(
        layout,
        randn(n, heads, head_dim),
        randn(n, kv_heads, head_dim),
        randn(n, kv_heads, head_dim),
        (randn(*cache_shape), randn(*cache_shape)),
    )


def torch_reference(step: Step, block_size: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The torch backend's output and cache, computed in float32 from the same values."""
    backend = TorchAttentionBackend()
    cache = (step.cache[0].float().clone(), step.cache[1].float().clone())
    out = backend.forward(
        step.q.float(), step.k.float(), step.v.float(), cache, backend.prepare(step.layout, block_size, CPU)
    )
    return out, cache


def run_triton(
    step: Step, block_size: int, *, num_sms: int = 1
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], int]:
    from regional_node.engine.attention.triton_backend import TritonAttentionBackend

    backend = TritonAttentionBackend(CPU, num_sms=num_sms)
    kv_heads, num_blocks, _, head_dim = step.cache[0].shape
    # allocate_kv_cache tells the backend the KV head count (it sizes the decode key split).
    cache = backend.allocate_kv_cache(
        num_layers=1,
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=step.cache[0].dtype,
        device=CPU,
    )[0]
    cache[0].copy_(step.cache[0])
    cache[1].copy_(step.cache[1])
    metadata = backend.prepare(step.layout, block_size, CPU)
    return backend.forward(step.q, step.k, step.v, cache, metadata), cache, metadata.num_segments


MIXED = [(40, 1), (17, 1), (1, 1), (16, 1), (70, 1), (50, 20), (30, 30), (33, 2), (65, 64)]
LAYOUTS = {
    "gqa-block16": dict(seqs=MIXED, kv_heads=2, group=2, head_dim=16, block_size=16),
    "gqa3-block32": dict(seqs=MIXED, kv_heads=2, group=3, head_dim=32, block_size=32, seed=1),
    "mqa-headdim24-block16": dict(seqs=MIXED[::2], kv_heads=1, group=4, head_dim=24, block_size=16, seed=2),
    "mha-block32": dict(seqs=MIXED[1::2], kv_heads=4, group=1, head_dim=16, block_size=32, seed=3),
}


@pytest.mark.parametrize("case", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_attention_and_cache_writes_match_the_torch_backend(case: dict) -> None:
    step = random_step(**case)
    expected, expected_cache = torch_reference(step, case["block_size"])
    out, cache, segments = run_triton(step, case["block_size"])
    assert segments == 1
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(cache[0], expected_cache[0]) and torch.equal(cache[1], expected_cache[1])


def test_small_decode_batch_split_over_key_ranges_matches_the_torch_backend() -> None:
    step = random_step([(130, 1), (17, 1), (64, 1), (1, 1)], kv_heads=2, group=2, head_dim=16, block_size=16)
    expected, _ = torch_reference(step, 16)
    out, _, segments = run_triton(step, 16, num_sms=32)  # 8 programs for 32 "SMs": split each sequence
    assert segments == 8
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
def test_half_precision_matches_float32_within_rounding(dtype: torch.dtype, tolerance: float) -> None:
    step = random_step(MIXED[3:], kv_heads=2, group=2, head_dim=16, block_size=16, dtype=dtype, seed=4)
    expected, expected_cache = torch_reference(step, 16)
    out, cache, _ = run_triton(step, 16)
    assert out.dtype == dtype and cache[0].dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    assert torch.equal(cache[0].float(), expected_cache[0]) and torch.equal(
        cache[1].float(), expected_cache[1]
    )


def test_write_kv_stores_each_token_at_its_slot_and_skips_padding() -> None:
    from regional_node.engine.attention.triton_kernels import write_kv

    g = torch.Generator().manual_seed(5)
    kv_heads, head_dim, block_size = 3, 8, 16
    k_cache = torch.randn(kv_heads, 6, block_size, head_dim, generator=g)
    v_cache = torch.randn_like(k_cache)
    before = (k_cache.clone(), v_cache.clone())
    # Strided inputs, as the model hands them over: views into one fused q/k/v row per token.
    qkv = torch.randn(5, 2 * kv_heads + 1, head_dim, generator=g)
    k, v = qkv[:, :kv_heads], qkv[:, kv_heads + 1 :]
    slots = [3, 95, -1, 16, 40]
    write_kv(k, v, k_cache, v_cache, torch.tensor(slots))
    for cache, old, new in ((k_cache, before[0], k), (v_cache, before[1], v)):
        expected = old.clone()
        for token, slot in enumerate(slots):
            if slot >= 0:
                expected[:, slot // block_size, slot % block_size] = new[token]
        assert torch.equal(cache, expected)

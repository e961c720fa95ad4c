"""The Triton kernels behind the `triton` attention backend, and the functions that launch them.

Imported only when that backend is selected (triton is an optional dependency). Whether Triton
compiles the kernels for the GPU or runs them in its CPU interpreter is fixed when this module is
imported: `@triton.jit` reads TRITON_INTERPRET at decoration time.

Cache layout (shared with the torch backend): per layer, K and V are each
[num_kv_heads, num_blocks, block_size, head_dim], so one KV head's block is one contiguous
[block_size, head_dim] tile.

`write_kv`: one program per new token stores its K and V for every KV head at its slot
(slot = block * block_size + offset); slot -1 marks a padding token and writes nothing.

`paged_attention`: one unified kernel for decodes and prefill chunks (after Triton's
"unified attention" design in vLLM). A program owns one KV head and BLOCK_Q consecutive query
tokens of one sequence, and all GROUP query heads that share that KV head, as BLOCK_M =
BLOCK_Q * GROUP rows of a single Q tile: grouped-query attention reads each K/V tile once for the
whole group and never repeats K/V. It walks the sequence's keys in tiles of TILE tokens through the
block table (any TILE, independent of block_size: each key finds its own block), with an online
softmax in float32 (exp2, the scale folded into log2 space), up to the last key its rows may see;
query i of a chunk sees keys [0, prefix + i], prefix = context_len - query_len. Programs find their
sequence by binary search over query_start_loc, so the grid depends only on (num_tokens, num_seqs)
— a decode batch of a given size always launches the same grid, which CUDA graphs need.

Decode batches too small to fill the GPU split each sequence's keys into NUM_SEGMENTS ranges
processed by separate programs (flash-decoding); a second kernel merges the partial softmax
states.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# @triton.jit below turned into interpreter functions iff this was set when they were decorated.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Keys per inner-loop iteration. 32 keeps K and V tiles of a 128-wide head in registers at BLOCK_M 64.
_TILE = 32
_MAX_SEGMENTS = 16
_LOG2_E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_cache_head,
    stride_cache_block,
    stride_cache_slot,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_P: tl.constexpr,
    DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_P)
    dims = tl.arange(0, DIM_P)
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    dst = (
        heads[:, None].to(tl.int64) * stride_cache_head
        + block * stride_cache_block
        + offset * stride_cache_slot
        + dims[None, :]
    )
    k = tl.load(k_ptr + token * stride_k_token + heads[:, None] * stride_k_head + dims[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + heads[:, None] * stride_v_head + dims[None, :], mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    scale_log2,
    num_seqs,
    stride_q_token,
    stride_q_head,
    stride_o_token,
    stride_o_head,
    stride_cache_head,
    stride_cache_block,
    stride_cache_slot,
    stride_table,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    # Sequence s owns q blocks from query_start[s] // BLOCK_Q + s on (always enough for its
    # cdiv(query_len, BLOCK_Q) blocks); find the last s whose first block is <= ours.
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_ptr + mid) // BLOCK_Q + mid
        if first <= q_block:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= q_len:
        return
    prefix = tl.load(seq_lens_ptr + seq) - q_len

    rows = tl.arange(0, BLOCK_M)
    q_index = local_block * BLOCK_Q + rows // GROUP  # query token within the sequence's chunk
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_index < q_len)
    dims = tl.arange(0, DIM_P)
    dim_ok = dims < HEAD_DIM
    token = q_start + q_index
    q = tl.load(
        q_ptr + token[:, None] * stride_q_token + head[:, None] * stride_q_head + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    # Keys [0, kv_end) are visible to at least one row of this block; row i sees [0, prefix + i].
    kv_end = prefix + tl.minimum(local_block * BLOCK_Q + BLOCK_Q, q_len)
    causal_limit = prefix + q_index
    num_tiles = tl.cdiv(kv_end, TILE)
    if NUM_SEGMENTS > 1:
        per_segment = tl.cdiv(num_tiles, NUM_SEGMENTS)
        tile_lo = segment * per_segment
        tile_hi = tl.minimum(tile_lo + per_segment, num_tiles)
    else:
        tile_lo = 0
        tile_hi = num_tiles

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)  # the running softmax denominator
    acc = tl.zeros([BLOCK_M, DIM_P], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_table
    head_base = kv_head.to(tl.int64) * stride_cache_head
    for t in range(tile_lo, tile_hi):
        keys = t * TILE + tl.arange(0, TILE)
        key_ok = keys < kv_end
        blocks = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        kv_offsets = head_base + blocks * stride_cache_block + (keys % BLOCK_SIZE) * stride_cache_slot
        k = tl.load(
            k_cache_ptr + kv_offsets[None, :] + dims[:, None],
            mask=key_ok[None, :] & dim_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_cache_ptr + kv_offsets[:, None] + dims[None, :],
            mask=key_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        visible = key_ok[None, :] & (keys[None, :] <= causal_limit[:, None])
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # A row that has seen no visible key yet keeps m = -inf; subtracting 0 keeps exp2 finite.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        denom = denom * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new

    if NUM_SEGMENTS == 1:
        out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_o_token + head[:, None] * stride_o_head + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )
    else:
        num_heads = tl.num_programs(1) * GROUP
        part = (token.to(tl.int64) * num_heads + head) * NUM_SEGMENTS + segment
        tl.store(part_max_ptr + part, m, mask=row_ok)
        tl.store(part_sum_ptr + part, denom, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * DIM_P + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _merge_segments_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    stride_o_token,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    DIM_P: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    segments = tl.arange(0, NUM_SEGMENTS)
    dims = tl.arange(0, DIM_P)
    base = (token.to(tl.int64) * tl.num_programs(1) + head) * NUM_SEGMENTS
    maxes = tl.load(part_max_ptr + base + segments)
    sums = tl.load(part_sum_ptr + base + segments)
    top = tl.max(maxes, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    weights = tl.exp2(maxes - top)  # empty segments have max -inf: weight 0
    total = tl.sum(sums * weights, axis=0)
    accs = tl.load(part_acc_ptr + (base + segments)[:, None] * DIM_P + dims[None, :])
    out = tl.sum(accs * weights[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + token * stride_o_token + head * stride_o_head + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def _pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(n))


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: [tokens, kv_heads, head_dim] (last dim contiguous); caches [kv_heads, blocks, block_size, head_dim]."""
    num_tokens, kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        HEADS_P=_pow2_at_least(kv_heads),
        DIM_P=_pow2_at_least(head_dim),
        BLOCK_SIZE=k_cache.shape[2],
    )


def decode_segments(num_seqs: int, num_kv_heads: int, num_sms: int) -> int:
    """How many key ranges each decode is split into: enough programs for ~2 per SM, a power of 2."""
    programs = num_seqs * num_kv_heads
    if programs >= num_sms:
        return 1
    return min(_MAX_SEGMENTS, triton.next_power_of_2(-(-2 * num_sms // programs)))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    num_seqs: int,
    max_query_len: int,
    num_segments: int = 1,
) -> torch.Tensor:
    """Causal paged attention for a flattened step; q: [tokens, heads, head_dim] -> the same shape.

    Sequence s has queries q[query_start_loc[s]:query_start_loc[s+1]], the last of its
    seq_lens[s] context tokens, whose K/V are already in the cache through block_tables[s].
    `num_segments` > 1 (decode-only steps) splits each sequence's keys across programs.
    """
    num_tokens, num_heads, head_dim = q.shape
    kv_heads, _, block_size, _ = k_cache.shape
    group = num_heads // kv_heads
    assert q.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert num_segments == 1 or max_query_len == 1, "split keys only for decode-only steps"
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    # Decodes fill a 16-row tile with the group's heads; prefill chunks take 64 rows, so each K/V
    # tile loaded serves several query tokens.
    block_m = _pow2_at_least(group, 16 if max_query_len == 1 else 64)
    block_q = block_m // group
    dim_p = _pow2_at_least(head_dim, 16)
    if num_segments > 1:
        part_acc = torch.empty(
            (num_tokens, num_heads, num_segments, dim_p), dtype=torch.float32, device=q.device
        )
        part_max = torch.empty((num_tokens, num_heads, num_segments), dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # never touched
    grid = (num_tokens // block_q + num_seqs, kv_heads, num_segments)
    _paged_attention_kernel[grid](
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        part_acc,
        part_max,
        part_sum,
        head_dim**-0.5 * _LOG2_E,
        num_seqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        DIM_P=dim_p,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE=_TILE,
        NUM_SEGMENTS=num_segments,
        # float32 must stay float32 (Triton's default on GPUs is TF32).
        IEEE=q.dtype == torch.float32,
        # The interpreter multiplies bfloat16 tiles as their raw 16-bit integers; float32 is exact.
        UPCAST=INTERPRETED and q.dtype == torch.bfloat16,
    )
    if num_segments > 1:
        _merge_segments_kernel[(num_tokens, num_heads)](
            out,
            part_acc,
            part_max,
            part_sum,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            DIM_P=dim_p,
            NUM_SEGMENTS=num_segments,
        )
    return out

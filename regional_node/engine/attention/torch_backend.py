"""Paged attention in plain PyTorch (CPU and CUDA): gather through block tables, then attend.

Cache layout per layer: [num_kv_heads, num_blocks, block_size, head_dim], KV-head major, so that
gathering a sequence's blocks yields one contiguous [context, head_dim] matrix per KV head and
attention is two batched matmuls with no copies in between.

Decodes (one query token per sequence): sequences are grouped into buckets of similar context
length (sorted longest first by the runner); each bucket gathers its blocks into a reused
workspace (a fresh multi-megabyte tensor per layer costs page faults that dominate on CPU) and
computes softmax(q k^T) v with a padding bias. The query heads of one KV group are treated as
query rows, so grouped-query attention needs no K/V repetition.
Prefill chunks: a chunk with no cached prefix attends to its own new K/V with SDPA's is_causal;
a chunk after a cached prefix (or an earlier chunk) gathers its context and uses an offset
causal mask.

Measured alternative, not taken: keeping each bucket's gathered K/V across steps and appending
only the new token saves the gather, but the matmuls then read from memory instead of cache and
the net gain was within noise, for a second copy of the running sequences' KV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from regional_node.engine.attention.base import LayerKVCache, StepLayout, zeroed_kv_cache

# A new decode bucket starts when a context is shorter than this share of the bucket's longest
# (measured on CPU: more padding costs more than one extra gather + two matmuls) ...
_BUCKET_RATIO = 0.85
# ... but never for fewer sequences than this (per-call overhead dominates small buckets).
_MIN_BUCKET = 8


@dataclass
class _DecodeBucket:
    start: int  # the bucket's sequences are the step's tokens [start, end)
    end: int
    block_ids: torch.Tensor  # [n * max_blocks], padded with block 0 (masked out)
    bias: torch.Tensor  # [1, n, 1, max_blocks * block_size]: 0 to attend, -inf for padding


@dataclass
class _Prefill:
    start: int
    length: int
    block_ids: torch.Tensor | None  # None: no prefix, attend to the new K/V only
    mask: torch.Tensor | None  # [length, padded context], True = attend


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor
    decode_buckets: list[_DecodeBucket]
    prefills: list[_Prefill]


class TorchAttentionBackend:
    name = "torch"
    # Its decode buckets and gather sizes follow each step's context lengths: no fixed shapes to capture.
    supports_cuda_graphs = False

    def __init__(self) -> None:
        self._workspace: tuple[torch.Tensor, torch.Tensor] | None = None
        self._dtype = torch.float32  # the KV cache's, set by allocate_kv_cache

    def allocate_kv_cache(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> list[LayerKVCache]:
        self._dtype = dtype
        return zeroed_kv_cache(
            num_layers=num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )

    def prepare(self, layout: StepLayout, block_size: int, device: torch.device) -> TorchAttentionMetadata:
        slot_mapping = torch.tensor(layout.slot_mapping, dtype=torch.long, device=device)
        buckets = [
            self._decode_bucket(layout, start, end, block_size, device)
            for start, end in _bucket_bounds(layout.decode_context_lens)
        ]
        prefills = []
        for span in layout.prefills:
            if span.context_len == span.query_len:
                prefills.append(_Prefill(span.query_start, span.query_len, None, None))
                continue
            num_blocks = -(-span.context_len // block_size)
            block_ids = torch.tensor(span.block_table[:num_blocks], dtype=torch.long, device=device)
            keys = torch.arange(num_blocks * block_size, device=device)
            queries = torch.arange(span.query_len, device=device)
            offset = span.context_len - span.query_len
            mask = (keys[None, :] - queries[:, None]) <= offset
            prefills.append(_Prefill(span.query_start, span.query_len, block_ids, mask))
        return TorchAttentionMetadata(slot_mapping, buckets, prefills)

    def _decode_bucket(
        self, layout: StepLayout, start: int, end: int, block_size: int, device: torch.device
    ) -> _DecodeBucket:
        lens = layout.decode_context_lens[start:end]
        max_blocks = -(-lens[0] // block_size)  # sorted longest first
        flat: list[int] = []
        for table, n in zip(layout.decode_block_tables[start:end], lens, strict=True):
            used = -(-n // block_size)
            flat.extend(table[:used])
            flat.extend([0] * (max_blocks - used))
        block_ids = torch.tensor(flat, dtype=torch.long, device=device)
        ctx = torch.tensor(lens, dtype=torch.long, device=device)
        padding = torch.arange(max_blocks * block_size, device=device)[None, :] >= ctx[:, None]
        bias = torch.zeros(padding.shape, dtype=self._dtype, device=device).masked_fill_(padding, -math.inf)
        return _DecodeBucket(start, end, block_ids, bias[None, :, None, :])

    def _gather(self, kv_cache: LayerKVCache, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the given blocks as [kv_heads, len(block_ids) * block_size, head_dim]."""
        k_cache, v_cache = kv_cache
        kv_heads, _, block_size, head_dim = k_cache.shape
        numel = kv_heads * block_ids.numel() * block_size * head_dim
        ws = self._workspace
        if (
            ws is None
            or ws[0].numel() < numel
            or ws[0].dtype != k_cache.dtype
            or ws[0].device != k_cache.device
        ):
            size = max(numel, int(ws[0].numel() * 1.5) if ws is not None else 0)
            ws = self._workspace = (
                torch.empty(size, dtype=k_cache.dtype, device=k_cache.device),
                torch.empty(size, dtype=k_cache.dtype, device=k_cache.device),
            )
        shape = (kv_heads, block_ids.numel(), block_size, head_dim)
        k = torch.index_select(k_cache, 1, block_ids, out=ws[0][:numel].view(shape))
        v = torch.index_select(v_cache, 1, block_ids, out=ws[1][:numel].view(shape))
        return k.view(kv_heads, -1, head_dim), v.view(kv_heads, -1, head_dim)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: TorchAttentionMetadata,
    ) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        kv_heads, head_dim = k_cache.shape[0], k_cache.shape[3]
        k_cache.view(kv_heads, -1, head_dim).index_copy_(1, metadata.slot_mapping, k.transpose(0, 1))
        v_cache.view(kv_heads, -1, head_dim).index_copy_(1, metadata.slot_mapping, v.transpose(0, 1))
        out = torch.empty_like(q)
        for b in metadata.decode_buckets:
            self._decode(b, q, kv_cache, out)
        for p in metadata.prefills:
            query = q[p.start : p.start + p.length].transpose(0, 1).unsqueeze(0)
            if p.block_ids is None:
                keys = k[p.start : p.start + p.length].transpose(0, 1).unsqueeze(0)
                values = v[p.start : p.start + p.length].transpose(0, 1).unsqueeze(0)
                res = F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=True)
            else:
                keys, values = self._gather(kv_cache, p.block_ids)
                res = F.scaled_dot_product_attention(
                    query, keys.unsqueeze(0), values.unsqueeze(0), attn_mask=p.mask, enable_gqa=True
                )
            out[p.start : p.start + p.length] = res[0].transpose(0, 1)
        return out

    def _decode(self, b: _DecodeBucket, q: torch.Tensor, kv_cache: LayerKVCache, out: torch.Tensor) -> None:
        kv_heads, head_dim = kv_cache[0].shape[0], kv_cache[0].shape[3]
        heads = q.shape[1]
        group = heads // kv_heads
        n = b.end - b.start
        keys, values = self._gather(kv_cache, b.block_ids)
        context = keys.shape[1] // n
        # [n, heads, d] -> [kv_heads * n, group, d]: each sequence's KV group is one batch entry.
        query = (q[b.start : b.end] * head_dim**-0.5).view(n, kv_heads, group, head_dim).transpose(0, 1)
        query = query.reshape(kv_heads * n, group, head_dim)
        scores = torch.bmm(query, keys.view(kv_heads * n, context, head_dim).transpose(1, 2))
        scores = scores.view(kv_heads, n, group, context).add_(b.bias).softmax(dim=-1)
        res = torch.bmm(
            scores.view(kv_heads * n, group, context), values.view(kv_heads * n, context, head_dim)
        )
        # One copy straight into the output rows (heads are [kv_head, group]-major, as in q).
        res = res.view(kv_heads, n, group, head_dim).transpose(0, 1)
        out[b.start : b.end].view(n, kv_heads, group, head_dim).copy_(res)


def _bucket_bounds(context_lens: list[int]) -> list[tuple[int, int]]:
    """Split decodes (sorted longest first) into runs of similar length."""
    bounds = []
    start = 0
    for i, n in enumerate(context_lens):
        if i - start >= _MIN_BUCKET and n < _BUCKET_RATIO * context_lens[start]:
            bounds.append((start, i))
            start = i
    if context_lens:
        bounds.append((start, len(context_lens)))
    return bounds

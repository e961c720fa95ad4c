"""Paged attention with our Triton kernels (triton_kernels.py): one kernel writes the step's K/V
through the slot mapping, one unified kernel attends for decodes and prefill chunks alike.

Metadata is four small tensors per step (slot mapping, block tables, context lengths, query start
offsets), shared by every layer. For CUDA graphs the same tensors live in fixed buffers sized for
the largest captured batch (`static_metadata`), refilled before each replay (`prepare_decode`).

On CPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1 when they are first
imported): that is how the tests check them; it is far too slow to serve with.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from regional_node.engine.attention import triton_kernels as kernels
from regional_node.engine.attention.base import LayerKVCache, StepLayout, zeroed_kv_cache
from regional_node.engine.errors import EngineConfigError


@dataclass
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; -1 = a padding token, nothing written
    block_tables: torch.Tensor  # [num_seqs, >= blocks of the longest context] int32
    seq_lens: torch.Tensor  # [num_seqs] int32: context length including this step's tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: the step's tokens of sequence s start here
    num_seqs: int
    max_query_len: int
    num_segments: int  # > 1 only for decode-only steps too small to fill the GPU


def _step_arrays(layout: StepLayout, block_size: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Per sequence (decodes, then prefill chunks): used blocks, context length, query start."""
    tables: list[list[int]] = []
    seq_lens: list[int] = []
    starts: list[int] = []
    for i, (table, n) in enumerate(zip(layout.decode_block_tables, layout.decode_context_lens, strict=True)):
        tables.append(table[: -(-n // block_size)])
        seq_lens.append(n)
        starts.append(i)
    for span in layout.prefills:
        tables.append(span.block_table[: -(-span.context_len // block_size)])
        seq_lens.append(span.context_len)
        starts.append(span.query_start)
    starts.append(layout.num_tokens)
    return tables, seq_lens, starts


def _table_tensor(tables: list[list[int]], width: int) -> torch.Tensor:
    flat: list[int] = []
    for table in tables:
        flat.extend(table)
        flat.extend([0] * (width - len(table)))
    return torch.tensor(flat, dtype=torch.int32).view(len(tables), width)


class TritonAttentionBackend:
    name = "triton"
    supports_cuda_graphs = True

    def __init__(self, device: torch.device, *, num_sms: int | None = None) -> None:
        if device.type == "cpu" and not kernels.INTERPRETED:
            raise EngineConfigError(
                "attention_backend 'triton' needs a CUDA device; on CPU its kernels run only under "
                "Triton's interpreter (TRITON_INTERPRET=1, for tests): use attention_backend 'torch'"
            )
        if num_sms is None:
            cuda = device.type == "cuda"
            num_sms = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1
        self.num_sms = num_sms  # sizes the decode key split; tests lower it to exercise the split
        self._num_kv_heads = 1

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
        self._num_kv_heads = num_kv_heads
        # The torch backend's layout and zeroing, so a cache means the same thing to both.
        return zeroed_kv_cache(
            num_layers=num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )

    def _segments(self, num_seqs: int, max_query_len: int) -> int:
        if max_query_len != 1:
            return 1
        return kernels.decode_segments(num_seqs, self._num_kv_heads, self.num_sms)

    def prepare(self, layout: StepLayout, block_size: int, device: torch.device) -> TritonAttentionMetadata:
        tables, seq_lens, starts = _step_arrays(layout, block_size)
        num_seqs = len(seq_lens)
        max_query_len = max((b - a for a, b in itertools.pairwise(starts)), default=0)
        width = max((len(t) for t in tables), default=1) or 1
        return TritonAttentionMetadata(
            slot_mapping=torch.tensor(layout.slot_mapping, dtype=torch.long, device=device),
            block_tables=_table_tensor(tables, width).to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            num_seqs=num_seqs,
            max_query_len=max_query_len,
            num_segments=self._segments(num_seqs, max_query_len),
        )

    # -- CUDA graphs ----------------------------------------------------------------------------
    def static_metadata(
        self, max_num_seqs: int, max_blocks_per_seq: int, device: torch.device
    ) -> TritonAttentionMetadata:
        """Decode metadata buffers for up to max_num_seqs sequences, at addresses that never change."""
        return TritonAttentionMetadata(
            slot_mapping=torch.full((max_num_seqs,), -1, dtype=torch.long, device=device),
            block_tables=torch.zeros((max_num_seqs, max_blocks_per_seq), dtype=torch.int32, device=device),
            seq_lens=torch.zeros(max_num_seqs, dtype=torch.int32, device=device),
            query_start_loc=torch.arange(max_num_seqs + 1, dtype=torch.int32, device=device),
            num_seqs=max_num_seqs,
            max_query_len=1,
            num_segments=self._segments(max_num_seqs, 1),
        )

    def prepare_decode(
        self, layout: StepLayout, block_size: int, static: TritonAttentionMetadata
    ) -> TritonAttentionMetadata:
        """Copy a decode-only layout into the front of `static`; returns metadata viewing it.

        Everything but the tensors' contents is a function of the batch size alone, so metadata
        returned here at capture time and at replay time launch identical kernels.
        """
        assert not layout.prefills and layout.num_tokens == len(layout.decode_context_lens)
        tables, seq_lens, _ = _step_arrays(layout, block_size)
        n = len(seq_lens)
        width = max((len(t) for t in tables), default=0)
        if width:
            static.block_tables[:n, :width].copy_(_table_tensor(tables, width), non_blocking=True)
        static.seq_lens[:n].copy_(torch.tensor(seq_lens, dtype=torch.int32), non_blocking=True)
        static.slot_mapping[:n].copy_(torch.tensor(layout.slot_mapping, dtype=torch.long), non_blocking=True)
        return TritonAttentionMetadata(
            slot_mapping=static.slot_mapping[:n],
            block_tables=static.block_tables[:n],
            seq_lens=static.seq_lens[:n],
            query_start_loc=static.query_start_loc[: n + 1],
            num_seqs=n,
            max_query_len=1,
            num_segments=self._segments(n, 1),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: TritonAttentionMetadata,
    ) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        kernels.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        return kernels.paged_attention(
            q,
            k_cache,
            v_cache,
            metadata.block_tables,
            metadata.seq_lens,
            metadata.query_start_loc,
            num_seqs=metadata.num_seqs,
            max_query_len=metadata.max_query_len,
            num_segments=metadata.num_segments,
        )

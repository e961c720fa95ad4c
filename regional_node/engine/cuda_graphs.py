"""Decode steps replayed from CUDA graphs (as vLLM and nano-vllm do).

A decode step of a small model is dominated by kernel-launch overhead: hundreds of small kernels
per token. So at start-up the decode forward pass is captured once per batch size of a ladder
(`capture_sizes`), reading its inputs from fixed buffers; a decode-only step of n sequences copies
its inputs into those buffers, padded to the next captured size (`pad_decode_step`), and replays
that graph. Padding sequences write no K/V (slot -1) and attend to nothing (context length 0);
their logits rows are dropped. Steps with a prefill chunk, or more sequences than the largest
captured size, run eagerly.

Only backends whose decode metadata has fixed shapes can be captured (`supports_cuda_graphs`).
Without a capture (on CPU, in tests) `run` executes the same padded step eagerly from the same
buffers, so everything but the capture itself is exercised without a GPU.
"""

from __future__ import annotations

import bisect
from typing import Any

import torch

from regional_node.engine.attention.base import AttentionBackend, LayerKVCache, StepLayout
from regional_node.engine.models.llama import LlamaModel

PADDING_SLOT = -1


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, up to and including max_num_seqs."""
    sizes = [n for n in (1, 2, 4, 8) if n < max_num_seqs]
    sizes += range(16, max_num_seqs, 16)
    return [*sizes, max_num_seqs]


def graph_batch_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds num_seqs sequences; None when none does."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


def pad_decode_step(
    input_ids: list[int], positions: list[int], layout: StepLayout, batch_size: int
) -> tuple[list[int], list[int], StepLayout]:
    """A decode-only step padded to batch_size sequences that write and read no KV."""
    assert not layout.prefills and len(input_ids) == layout.num_tokens <= batch_size
    pad = batch_size - layout.num_tokens
    return (
        input_ids + [0] * pad,
        positions + [0] * pad,
        StepLayout(
            num_tokens=batch_size,
            slot_mapping=layout.slot_mapping + [PADDING_SLOT] * pad,
            decode_block_tables=layout.decode_block_tables + [[] for _ in range(pad)],
            decode_context_lens=layout.decode_context_lens + [0] * pad,
        ),
    )


class DecodeGraphs:
    """Fixed input/output buffers for decode steps of up to max(sizes) sequences, and their graphs."""

    def __init__(
        self,
        model: LlamaModel,
        backend: AttentionBackend,
        kv_caches: list[LayerKVCache],
        *,
        block_size: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
    ) -> None:
        assert backend.supports_cuda_graphs, f"attention backend {backend.name!r} cannot be captured"
        self.model = model
        self.backend: Any = backend  # has static_metadata / prepare_decode (supports_cuda_graphs)
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.sizes = capture_sizes(max_num_seqs)
        device = model.device
        largest = self.sizes[-1]
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.rows = torch.arange(largest, device=device)
        self.logits = torch.empty((largest, model.config.vocab_size), dtype=model.dtype, device=device)
        self.metadata = self.backend.static_metadata(largest, max_blocks_per_seq, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _load(self, input_ids: list[int], positions: list[int], layout: StepLayout) -> Any:
        """Copy a padded step into the buffers; returns the attention metadata viewing them."""
        n = len(input_ids)
        self.input_ids[:n].copy_(torch.tensor(input_ids, dtype=torch.long), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(positions, dtype=torch.long), non_blocking=True)
        return self.backend.prepare_decode(layout, self.block_size, self.metadata)

    def _forward(self, batch_size: int, metadata: Any) -> None:
        logits = self.model.forward(
            self.input_ids[:batch_size],
            self.positions[:batch_size],
            self.kv_caches,
            self.backend,
            metadata,
            self.rows[:batch_size],
        )
        self.logits[:batch_size].copy_(logits)

    def capture(self) -> None:
        """Capture every size, largest first, sharing one memory pool (replays never overlap)."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            empty = StepLayout(num_tokens=0, slot_mapping=[])
            ids, positions, layout = pad_decode_step([], [], empty, size)
            metadata = self._load(ids, positions, layout)
            # Eager first: compiles the Triton kernels and settles the allocator outside the capture.
            # All-padding, so it writes no KV and the live cache is untouched.
            self._forward(size, metadata)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(size, metadata)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def run(self, input_ids: list[int], positions: list[int], layout: StepLayout) -> torch.Tensor | None:
        """Logits [n, vocab] for a decode-only step of n sequences, or None when n is above every size."""
        size = graph_batch_size(len(input_ids), self.sizes)
        if size is None:
            return None
        metadata = self._load(*pad_decode_step(input_ids, positions, layout, size))
        graph = self.graphs.get(size)
        if graph is not None:
            graph.replay()
        else:
            self._forward(size, metadata)
        return self.logits[: len(input_ids)]

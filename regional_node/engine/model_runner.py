"""Runs one scheduled step on the device: flattens the step's tokens, positions, slot mapping and
block tables into tensors (once per step, not per layer), runs the model once, samples."""

from __future__ import annotations

import torch

from regional_node.engine.attention.base import AttentionBackend, LayerKVCache, PrefillSpan, StepLayout
from regional_node.engine.models.llama import LlamaModel
from regional_node.engine.sampler import sample
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.scheduler import ScheduledChunk

# What the runner needs to sample for a chunk that completes its sequence's known tokens.
SamplingRequest = tuple[SamplingParams, torch.Generator | None]


class ModelRunner:
    def __init__(
        self, model: LlamaModel, backend: AttentionBackend, kv_caches: list[LayerKVCache], block_size: int
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = model.device

    @torch.inference_mode()
    def execute(
        self, chunks: list[ScheduledChunk], sampling: list[SamplingRequest | None]
    ) -> list[tuple[int, float] | None]:
        """Computes every chunk; returns (token, logprob) for chunks with a SamplingRequest, else None."""
        bs = self.block_size
        decodes = sorted(
            (i for i, c in enumerate(chunks) if c.num_tokens == 1), key=lambda i: -chunks[i].start
        )
        prefills = [i for i, c in enumerate(chunks) if c.num_tokens > 1]
        input_ids: list[int] = []
        positions: list[int] = []
        layout = StepLayout(num_tokens=0, slot_mapping=[])
        slots = layout.slot_mapping
        logits_rows: list[int] = []
        sampled: list[int] = []
        for i in decodes:
            seq = chunks[i].seq
            pos = chunks[i].start
            if sampling[i] is not None:
                logits_rows.append(len(input_ids))
                sampled.append(i)
            input_ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            layout.decode_block_tables.append(seq.block_table)
            layout.decode_context_lens.append(pos + 1)
        for i in prefills:
            chunk = chunks[i]
            seq, start, n = chunk.seq, chunk.start, chunk.num_tokens
            table = seq.block_table
            layout.prefills.append(PrefillSpan(len(input_ids), n, start + n, table))
            input_ids.extend(seq.token_ids[start : start + n])
            span = range(start, start + n)
            positions.extend(span)
            slots.extend([table[p // bs] * bs + p % bs for p in span])
            if sampling[i] is not None:
                logits_rows.append(len(input_ids) - 1)
                sampled.append(i)
        layout.num_tokens = len(input_ids)

        device = self.device
        metadata = self.backend.prepare(layout, bs, device)
        logits = self.model.forward(
            torch.tensor(input_ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            self.kv_caches,
            self.backend,
            metadata,
            torch.tensor(logits_rows, dtype=torch.long, device=device),
        )
        results: list[tuple[int, float] | None] = [None] * len(chunks)
        if sampled:
            requests = [sampling[i] for i in sampled]
            tokens, logprobs = sample(logits, [r[0] for r in requests if r], [r[1] for r in requests if r])
            for i, token, logprob in zip(sampled, tokens, logprobs, strict=True):
                results[i] = (token, logprob)
        return results

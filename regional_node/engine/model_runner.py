"""Runs one scheduled step on the device: flattens the step's tokens, positions, slot mapping and
block tables into tensors (once per step, not per layer), runs the model once, samples.

Decode-only steps replay a CUDA graph when `capture_decode_graphs` has run (cuda_graphs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from regional_node.engine.attention.base import AttentionBackend, LayerKVCache, PrefillSpan, StepLayout
from regional_node.engine.cuda_graphs import DecodeGraphs
from regional_node.engine.models.llama import LlamaModel
from regional_node.engine.sampler import SampledToken, sample
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.scheduler import ScheduledChunk
from regional_node.engine.speculative.verify import VerifyRun, verify

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
        self.decode_graphs: DecodeGraphs | None = None

    @torch.inference_mode()  # warm-up and capture in the mode execute() replays in
    def use_decode_graphs(self, *, max_num_seqs: int, max_blocks_per_seq: int, capture: bool = True) -> None:
        """Serve decode-only steps of up to max_num_seqs sequences from fixed buffers, replaying CUDA
        graphs captured now (capture=False runs the same padded steps eagerly: the CPU tests' path)."""
        self.decode_graphs = DecodeGraphs(
            self.model,
            self.backend,
            self.kv_caches,
            block_size=self.block_size,
            max_num_seqs=max_num_seqs,
            max_blocks_per_seq=max_blocks_per_seq,
        )
        if capture:
            self.decode_graphs.capture()

    @torch.inference_mode()
    def execute(
        self,
        chunks: list[ScheduledChunk],
        sampling: list[SamplingRequest | None],
        draft_probs: list[torch.Tensor | None] | None = None,
    ) -> list[list[SampledToken] | None]:
        """Computes every chunk; for chunks with a SamplingRequest returns the new tokens with their
        logprobs (one, or for a speculating chunk its accepted proposals and the target's token
        after them), else None. `draft_probs[i]`: the draft model's distributions q that chunk i's
        proposals were sampled from, one row per proposal (None: point masses, as n-gram ones)."""
        step = flatten_step(chunks, sampling, self.block_size)
        logits = self._logits(step)
        results: list[list[SampledToken] | None] = [None] * len(chunks)
        if step.sampled:
            requests = [sampling[i] for i in step.sampled]
            rows = logits[: len(step.sampled)] if step.verified else logits
            emitted = sample(rows, [r[0] for r in requests if r], [r[1] for r in requests if r])
            for i, token in zip(step.sampled, emitted, strict=True):
                results[i] = [token]
        if step.verified:
            runs = []
            for i, first_row in step.verified:
                params, generator = sampling[i]  # type: ignore[misc]
                probs = draft_probs[i] if draft_probs is not None else None
                runs.append(VerifyRun(first_row, chunks[i].draft_token_ids, params, generator, probs))
            for (i, _), emitted in zip(step.verified, verify(logits, runs), strict=True):
                results[i] = emitted
        return results

    @torch.inference_mode()
    def last_logits(self, chunks: list[ScheduledChunk], wanted: list[SamplingRequest | None]) -> torch.Tensor:
        """Computes every chunk; returns the logits after the last token of each chunk whose
        `wanted` entry is not None, one row per such chunk in chunk order (the draft model's step)."""
        step = flatten_step(chunks, wanted, self.block_size)
        logits = self._logits(step)
        order = sorted(range(len(step.sampled)), key=lambda row: step.sampled[row])
        return logits[order]

    def _logits(self, step: FlatStep) -> torch.Tensor:
        logits = None
        if self.decode_graphs is not None and not step.layout.prefills:
            logits = self.decode_graphs.run(step.input_ids, step.positions, step.layout)
            if logits is not None:
                logits = logits[step.logits_rows]
        if logits is None:
            device = self.device
            logits = self.model.forward(
                torch.tensor(step.input_ids, dtype=torch.long, device=device),
                torch.tensor(step.positions, dtype=torch.long, device=device),
                self.kv_caches,
                self.backend,
                self.backend.prepare(step.layout, self.block_size, device),
                torch.tensor(step.logits_rows, dtype=torch.long, device=device),
            )
        return logits


@dataclass
class FlatStep:
    """One step's tokens in the order the attention backends expect (decodes longest first, then
    prefill chunks), and where the logits to sample are."""

    input_ids: list[int]
    positions: list[int]
    layout: StepLayout
    logits_rows: list[int]  # rows of the step's tokens whose logits are sampled ...
    sampled: list[int]  # ... for these chunks (indices into the step's chunks), in the same order;
    # then speculating chunks' rows: (chunk index, its first row among the selected logits) for
    # each, the chunk's len(draft_token_ids) + 1 rows in position order from there.
    verified: list[tuple[int, int]] = field(default_factory=list)


def flatten_step(chunks: list[ScheduledChunk], sampling: list[SamplingRequest | None], bs: int) -> FlatStep:
    """A speculating decode (its last token plus k proposals) is laid out as k + 1 decode rows of
    one sequence with context lengths start+1 .. start+k+1: every backend writes the step's K/V
    before attending, so row j sees exactly the context and the proposals before it, as a causal
    chunk would, and the rows join the batched decode path (and its CUDA graphs)."""
    # (chunk index, offset in the chunk), longest context first.
    decodes = sorted(
        (
            (i, j)
            for i, c in enumerate(chunks)
            if c.num_tokens == 1 or c.draft_token_ids
            for j in range(c.num_tokens)
        ),
        key=lambda e: -(chunks[e[0]].start + e[1]),
    )
    prefills = [i for i, c in enumerate(chunks) if c.num_tokens > 1 and not c.draft_token_ids]
    step = FlatStep([], [], StepLayout(num_tokens=0, slot_mapping=[]), [], [])
    input_ids, positions, layout = step.input_ids, step.positions, step.layout
    slots = layout.slot_mapping
    verify_rows: dict[int, list[int]] = {}
    for i, j in decodes:
        chunk = chunks[i]
        seq = chunk.seq
        pos = chunk.start + j
        if sampling[i] is not None:
            if chunk.draft_token_ids:
                verify_rows.setdefault(i, [0] * chunk.num_tokens)[j] = len(input_ids)
            else:
                step.logits_rows.append(len(input_ids))
                step.sampled.append(i)
        input_ids.append(seq.token_ids[pos] if j == 0 else chunk.draft_token_ids[j - 1])
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
            step.logits_rows.append(len(input_ids) - 1)
            step.sampled.append(i)
    # Verification rows come after the sampled ones (so sample() sees exactly its rows first), each
    # chunk's rows in position order.
    for i, rows in verify_rows.items():
        step.verified.append((i, len(step.logits_rows)))
        step.logits_rows.extend(rows)
    layout.num_tokens = len(input_ids)
    return step

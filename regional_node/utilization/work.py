"""What one engine step costs in model FLOPs and memory traffic, from its batch and the model's
shape: the numerators of model FLOPs utilization (MFU) and memory-bandwidth utilization (MBU).

Counted (L layers, d hidden, H query heads, K KV heads, h head dim, I intermediate, V vocab,
b bytes per parameter of the serving dtype):
- linear FLOPs: 2 * L * (d*(H+2K)*h + H*h*d + 3*d*I) per token computed (q/k/v, o, gate/up, down);
- attention FLOPs: 4 * L * H * h per (query, key) pair (QK^T and AV); a chunk computing
  positions [s, s+n) of a sequence has n*s + n*(n+1)/2 pairs (causal, each token sees itself);
- lm_head FLOPs: 2 * d * V per sampled row (only chunks that reach a sequence's end are sampled);
- bytes: the weights once per step, b * (L*(d*(H+2K)*h + H*h*d + 3*d*I) + V*d), plus each
  token's embedding row (b*d), plus the KV cache each chunk reads (its s+n positions) and writes
  (its n), 2 * L * K * h * b per position. Activations are not counted (they stay in cache or
  registers in fused kernels; counting them would flatter the number).

Phases: a step with any prefill chunk (a chunk that is not a single token past the prompt) is a
prefill step, its decode rows riding along; a step of decodes only is a decode step. All of a
step's work and time go to its phase, so each phase's utilization is over its own steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Phase = Literal["prefill", "decode"]
PHASES: tuple[Phase, ...] = ("prefill", "decode")

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    bytes_per_param: int

    @property
    def linear_params_per_layer(self) -> int:
        d, h = self.hidden_size, self.head_dim
        return (
            d * (self.num_heads + 2 * self.num_kv_heads) * h
            + self.num_heads * h * d
            + 3 * d * self.intermediate_size
        )

    @property
    def weight_bytes(self) -> int:
        params = self.num_layers * self.linear_params_per_layer + self.vocab_size * self.hidden_size
        return self.bytes_per_param * params

    @property
    def kv_bytes_per_position(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


@dataclass(frozen=True)
class Chunk:
    """Positions [start, start + num_tokens) of one sequence computed in a step."""

    start: int
    num_tokens: int
    sampled: bool  # the chunk reaches the sequence's end, so the step samples a token for it
    decode: bool  # a single token past the prompt: a decode; anything else is prefill


@dataclass(frozen=True)
class StepWork:
    phase: Phase
    tokens: int
    flops: float
    bytes: float


def step_work(shape: ModelShape, chunks: Iterable[Chunk]) -> StepWork:
    chunks = list(chunks)
    tokens = sum(c.num_tokens for c in chunks)
    pairs = sum(c.num_tokens * c.start + c.num_tokens * (c.num_tokens + 1) // 2 for c in chunks)
    sampled = sum(1 for c in chunks if c.sampled)
    flops = (
        2 * shape.num_layers * shape.linear_params_per_layer * tokens
        + 4 * shape.num_layers * shape.num_heads * shape.head_dim * pairs
        + 2 * shape.hidden_size * shape.vocab_size * sampled
    )
    kv_positions = sum((c.start + c.num_tokens) + c.num_tokens for c in chunks)  # read + written
    moved = (
        shape.weight_bytes
        + tokens * shape.hidden_size * shape.bytes_per_param
        + kv_positions * shape.kv_bytes_per_position
    )
    phase: Phase = "decode" if chunks and all(c.decode for c in chunks) else "prefill"
    return StepWork(phase=phase, tokens=tokens, flops=float(flops), bytes=float(moved))

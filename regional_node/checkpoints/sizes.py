"""The named model shapes that `init_checkpoint` can write, and their parameter counts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Arch = Literal["llama", "qwen2"]
ARCHES: tuple[Arch, ...] = ("llama", "qwen2")


@dataclass(frozen=True)
class ModelShape:
    """Everything about a decoder-only transformer's shape that config.json records."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int

    def __post_init__(self) -> None:
        assert self.hidden_size % self.num_attention_heads == 0, "hidden_size must split evenly into heads"
        assert self.num_attention_heads % self.num_key_value_heads == 0, "GQA groups must be whole"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def parameter_count(self, *, arch: Arch, tied: bool) -> int:
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attention = 2 * h * h + 2 * h * kv + (h + 2 * kv if arch == "qwen2" else 0)
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h
        embeddings = self.vocab_size * h * (1 if tied else 2)
        return embeddings + self.num_hidden_layers * per_layer + h


SizeName = Literal["tiny", "mini", "small", "medium", "large"]

# tiny: unit tests (created in well under a second) and the demo's small tier; mini: the demo's
# large tier (trained by `meridian up` in about a minute on two cores, so it shares tiny's
# vocabulary); small: the engine benchmark; medium and large: GPU nodes only, never created by tests.
SIZES: dict[str, ModelShape] = {
    "tiny": ModelShape(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
        max_position_embeddings=4096,
    ),
    "mini": ModelShape(
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
        max_position_embeddings=4096,
    ),
    "small": ModelShape(
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=8192,
        max_position_embeddings=4096,
    ),
    "medium": ModelShape(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=8192,
        max_position_embeddings=8192,
    ),
    "large": ModelShape(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=8192,
        max_position_embeddings=32768,
    ),
}


def ties_embeddings(arch: Arch, size: str) -> bool:
    """Qwen2 ties lm_head to the embeddings in its small releases (0.5B, 1.5B); Llama never does."""
    return arch == "qwen2" and size != "large"


def shape_for(size: str, **overrides: int) -> ModelShape:
    """The named shape with any fields replaced, e.g. `shape_for("tiny", num_key_value_heads=4)`."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    return dataclasses.replace(SIZES[size], **overrides)

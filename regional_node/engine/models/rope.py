"""Rotary position embeddings, computed exactly as transformers does (float32 tables, rotate-half)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """inv_freq for rope types default, linear and llama3 (see transformers' modeling_rope_utils)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def rope_tables(
    max_positions: int, head_dim: int, theta: float, scaling: dict[str, Any], dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed-sin tables of shape [max_positions, head_dim].

    The sin table has its first half negated so that rotate_half(x) * sin == swap_halves(x) * signed_sin,
    which saves the negation per layer and rounds exactly like transformers.
    """
    inv_freq = inverse_frequencies(head_dim, theta, scaling)
    positions = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    half = head_dim // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.to(dtype=dtype, device=device), signed_sin.to(dtype=dtype, device=device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos/signed_sin: [tokens, 1, head_dim]."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    # In place where possible; each product is rounded before the sum, exactly as transformers does.
    return (x * cos).add_(swapped.mul_(signed_sin))


# Rotates a layer's q and k, [tokens, heads + kv_heads, head_dim] with the q heads first; returns
# them rotated (a kernel may rotate them in place and return its argument).
Rotate = Callable[[torch.Tensor, int], torch.Tensor]


class Rope(Protocol):
    """Rotary embeddings on the model's tables: `at` runs once per step, its Rotate once per layer."""

    def at(self, positions: torch.Tensor) -> Rotate: ...


class TorchRope:
    def __init__(self, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
        self.cos, self.signed_sin = cos, signed_sin

    def at(self, positions: torch.Tensor) -> Rotate:
        cos = self.cos[positions].unsqueeze(1)
        sin = self.signed_sin[positions].unsqueeze(1)
        return lambda qk, heads: apply_rope(qk, cos, sin)

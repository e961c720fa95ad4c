"""Random weights for Llama / Qwen2 checkpoints, named exactly as transformers names them.

The usual 0.02-std init makes a random model's logits nearly uniform, so greedy tokens hinge on
near-ties and flip with any change in floating-point summation order (batching, chunking). These
scales instead give logits with a standard deviation of about LOGIT_STD, so the top-1/top-2 margin
is typically whole logits, while every layer moves the residual stream at least as much as the
embedding does — a cache or attention bug changes the tokens, as it would with a real model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from regional_node.checkpoints.sizes import Arch, ModelShape


@dataclass(frozen=True)
class InitScales:
    logit_std: float = 8.0
    # Sharper-than-default attention, so which earlier tokens a position attends to matters.
    qk_gain: float = 2.0
    bias_std: float = 0.5
    # Gain on o_proj/down_proj. With tied embeddings the residual must be dominated by the layers:
    # otherwise norm(h)·E[token] is largest for the current token and greedy decoding repeats it.
    residual_gain: float = 1.0
    tied_residual_gain: float = 8.0
    # Norm weights around 1 rather than exactly 1, so an engine that skips them gets other tokens.
    norm_jitter: float = 0.2


def random_state_dict(
    shape: ModelShape, *, arch: Arch, tied: bool, seed: int, scales: InitScales = InitScales()
) -> dict[str, torch.Tensor]:
    """All parameters in float32, deterministic in (shape, arch, tied, seed, scales)."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*dims: int, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*dims, generator=generator, dtype=torch.float32) * std + mean

    h, inter = shape.hidden_size, shape.intermediate_size
    q_out = shape.num_attention_heads * shape.head_dim
    kv_out = shape.num_key_value_heads * shape.head_dim
    head_std = scales.logit_std / math.sqrt(h)  # the final norm leaves hidden states at unit RMS
    fan_in = 1.0 / math.sqrt(h)
    out_gain = scales.tied_residual_gain if tied else scales.residual_gain
    qk_std, norm_std = scales.qk_gain * fan_in, scales.norm_jitter

    weights: dict[str, torch.Tensor] = {}
    # Tied: the one matrix must serve as lm_head, so it takes the lm_head scale.
    weights["model.embed_tokens.weight"] = normal(shape.vocab_size, h, std=head_std if tied else 1.0)
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}"
        weights[f"{p}.input_layernorm.weight"] = normal(h, std=norm_std, mean=1.0)
        weights[f"{p}.self_attn.q_proj.weight"] = normal(q_out, h, std=qk_std)
        weights[f"{p}.self_attn.k_proj.weight"] = normal(kv_out, h, std=qk_std)
        weights[f"{p}.self_attn.v_proj.weight"] = normal(kv_out, h, std=fan_in)
        if arch == "qwen2":
            weights[f"{p}.self_attn.q_proj.bias"] = normal(q_out, std=scales.bias_std)
            weights[f"{p}.self_attn.k_proj.bias"] = normal(kv_out, std=scales.bias_std)
            weights[f"{p}.self_attn.v_proj.bias"] = normal(kv_out, std=scales.bias_std)
        weights[f"{p}.self_attn.o_proj.weight"] = normal(h, q_out, std=out_gain / math.sqrt(q_out))
        weights[f"{p}.post_attention_layernorm.weight"] = normal(h, std=norm_std, mean=1.0)
        weights[f"{p}.mlp.gate_proj.weight"] = normal(inter, h, std=fan_in)
        weights[f"{p}.mlp.up_proj.weight"] = normal(inter, h, std=fan_in)
        weights[f"{p}.mlp.down_proj.weight"] = normal(h, inter, std=out_gain / math.sqrt(inter))
    weights["model.norm.weight"] = normal(h, std=norm_std, mean=1.0)
    if not tied:
        weights["lm_head.weight"] = normal(shape.vocab_size, h, std=head_std)
    return weights

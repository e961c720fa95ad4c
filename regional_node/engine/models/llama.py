"""Llama-family decoder (Llama and Qwen2 share it; Qwen2 only adds q/k/v biases).

Plain tensors and functions rather than nn.Modules: the step runs the whole flattened batch
([tokens, hidden], no padding) through each layer once, with q/k/v and gate/up fused into single
matmuls. Numerics follow transformers (float32 RoPE tables, rotate-half, RMSNorm then weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from regional_node.engine.attention.base import AttentionBackend, LayerKVCache
from regional_node.engine.config import ModelConfig
from regional_node.engine.models.rope import apply_rope, rope_tables


@dataclass
class DecoderLayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        embed_tokens: torch.Tensor,
        layers: list[DecoderLayerWeights],
        norm: torch.Tensor,
        lm_head: torch.Tensor,
        max_positions: int,
    ) -> None:
        self.config = config
        self.embed_tokens = embed_tokens
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.cos, self.sin = rope_tables(
            max_positions,
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            embed_tokens.dtype,
            str(embed_tokens.device),
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[LayerKVCache],
        backend: AttentionBackend,
        attn_metadata: Any,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Logits [len(logits_indices), vocab] for the flattened step; writes every token's K/V."""
        cfg = self.config
        eps = cfg.rms_norm_eps
        hidden = cfg.hidden_size
        heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qk_width = (heads + kv_heads) * head_dim
        num_tokens = input_ids.shape[0]
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        h = F.embedding(input_ids, self.embed_tokens)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = F.rms_norm(h, (hidden,), layer.input_norm, eps)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias)
            qk = apply_rope(qkv[:, :qk_width].view(num_tokens, heads + kv_heads, head_dim), cos, sin)
            v = qkv[:, qk_width:].view(num_tokens, kv_heads, head_dim)
            attn = backend.forward(qk[:, :heads], qk[:, heads:], v, kv_caches[i], attn_metadata)
            h = h + F.linear(attn.view(num_tokens, heads * head_dim), layer.o, layer.o_bias)
            if i == last:
                # Every token's K/V is written by now; only the sampled positions need the rest.
                h = h[logits_indices]
            x = F.rms_norm(h, (hidden,), layer.post_attention_norm, eps)
            gate, up = F.linear(x, layer.gate_up, layer.gate_up_bias).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate, inplace=True).mul_(up), layer.down, layer.down_bias)
        if not self.layers:
            h = h[logits_indices]
        h = F.rms_norm(h, (hidden,), self.norm, eps)
        return F.linear(h, self.lm_head)

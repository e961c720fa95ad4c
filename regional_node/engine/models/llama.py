"""Llama-family decoder (Llama and Qwen2 share it; Qwen2 only adds q/k/v biases).

Plain tensors and functions rather than nn.Modules: the step runs the whole flattened batch
([tokens, hidden], no padding) through each layer once, with q/k/v and gate/up fused into single
matmuls. Numerics follow transformers (float32 RoPE tables, rotate-half, RMSNorm then weight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from regional_node.engine.attention.base import AttentionBackend, LayerKVCache
from regional_node.engine.config import ModelConfig
from regional_node.engine.models.rope import Rope, TorchRope, rope_tables


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


# The most bytes of [rows, 2 * intermediate] activation the MLP makes at once (LlamaModel._mlp):
# 512 rows of the 100M model's 5120-wide gate/up. Under glibc malloc's 32 MiB mmap limit, with room.
MLP_SLICE_BYTES = 10 << 20

# x @ weight.T (+ bias), for one weight; how is the kernel's business (plain torch, or a GEMM with
# the weight prepacked once for it).
Linear = Callable[[torch.Tensor], torch.Tensor]
# Makes the Linear for a [out, in] weight and its bias.
LinearPacker = Callable[[torch.Tensor, torch.Tensor | None], Linear]


def torch_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    return lambda x: F.linear(x, weight, bias)


def torch_add_rms_norm(
    delta: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + delta) * weight, residual + delta); no delta: the residual as it is."""
    if delta is not None:
        residual = residual + delta
    return F.rms_norm(residual, (residual.shape[-1],), weight, eps), residual


def torch_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate, inplace=True).mul_(up)


@dataclass(frozen=True)
class DenseKernels:
    """The model's ops other than attention: torch's by default; a backend may bring its own
    (vLLM's fused and prepacked CPU kernels: attention/vllm_backend.py)."""

    linear: LinearPacker = torch_linear
    # May update its arguments in place: the model passes tensors it no longer needs.
    add_rms_norm: Callable[
        [torch.Tensor | None, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]
    ] = torch_add_rms_norm
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor] = torch_silu_and_mul
    # Made once from the model's (cos, signed sin) tables (models/rope.py).
    rope: Callable[[torch.Tensor, torch.Tensor], Rope] = TorchRope


@dataclass(frozen=True)
class LayerLinears:
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear


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
        # Only the CPU needs it: CUDA's caching allocator reuses its blocks whatever their size.
        width = 2 * config.intermediate_size * embed_tokens.element_size()
        self.mlp_rows = max(1, MLP_SLICE_BYTES // width) if embed_tokens.device.type == "cpu" else None
        self.cos, self.sin = rope_tables(
            max_positions,
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            embed_tokens.dtype,
            str(embed_tokens.device),
        )
        self.use_kernels(DenseKernels())

    def use_kernels(self, kernels: DenseKernels) -> None:
        """Runs the model on `kernels` from now on (each weight packed for its linear once, here)."""
        self.kernels = kernels
        pack = kernels.linear
        self.linears = [
            LayerLinears(
                qkv=pack(w.qkv, w.qkv_bias),
                o=pack(w.o, w.o_bias),
                gate_up=pack(w.gate_up, w.gate_up_bias),
                down=pack(w.down, w.down_bias),
            )
            for w in self.layers
        ]
        self.lm_head_linear = pack(self.lm_head, None)
        self.rope = kernels.rope(self.cos, self.sin)

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
        heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qk_width = (heads + kv_heads) * head_dim
        num_tokens = input_ids.shape[0]
        rotate = self.rope.at(positions)
        add_rms_norm = self.kernels.add_rms_norm
        # The residual stream `h` and what the last block adds to it (`delta`): the add is done
        # with the next norm, which kernels may fuse.
        h = F.embedding(input_ids, self.embed_tokens)
        delta = None
        last = len(self.layers) - 1
        for i, (layer, linear) in enumerate(zip(self.layers, self.linears, strict=True)):
            x, h = add_rms_norm(delta, h, layer.input_norm, eps)
            qkv = linear.qkv(x)
            qk = rotate(qkv[:, :qk_width].view(num_tokens, heads + kv_heads, head_dim), heads)
            v = qkv[:, qk_width:].view(num_tokens, kv_heads, head_dim)
            attn = backend.forward(qk[:, :heads], qk[:, heads:], v, kv_caches[i], attn_metadata)
            delta = linear.o(attn.view(num_tokens, heads * head_dim))
            if i == last:
                # Every token's K/V is written by now; only the sampled positions need the rest.
                h, delta = h[logits_indices], delta[logits_indices]
            x, h = add_rms_norm(delta, h, layer.post_attention_norm, eps)
            delta = self._mlp(linear, x)
        if not self.layers:
            h = h[logits_indices]
        x, _ = add_rms_norm(delta, h, self.norm, eps)
        return self.lm_head_linear(x)

    def _mlp(self, linear: LayerLinears, x: torch.Tensor) -> torch.Tensor:
        # A long prefill step goes through in slices of rows. Whole, its [rows, 2 * intermediate]
        # activation (42 MB for 2048 rows of the 100M model) is past what glibc's malloc keeps
        # in its heap: mapped afresh for every layer, page-faulted in, unmapped. That cost ~15%
        # of the 100M model's time on CPU. Sliced, it stays in cache and in the free lists.
        silu_and_mul = self.kernels.silu_and_mul
        if self.mlp_rows is None or x.shape[0] <= self.mlp_rows:
            return linear.down(silu_and_mul(linear.gate_up(x)))
        return torch.cat([linear.down(silu_and_mul(linear.gate_up(part))) for part in x.split(self.mlp_rows)])

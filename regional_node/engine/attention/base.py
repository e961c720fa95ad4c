"""The attention backend interface and the backend-neutral description of one step.

A step's tokens are laid out as: every single-query sequence (decodes) first, sorted by context
length, longest first; then every multi-token prefill chunk. New K/V are written to the paged pool
through `slot_mapping` (slot = block * block_size + offset) before attention reads through the
block tables, so a sequence always attends to its own new tokens as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

# One (key_cache, value_cache) pair per layer; the layout is the backend's choice (see its allocate_kv_cache).
LayerKVCache = tuple[torch.Tensor, torch.Tensor]


@dataclass
class PrefillSpan:
    """A chunk of `query_len` tokens at positions [context_len - query_len, context_len)."""

    query_start: int
    query_len: int
    context_len: int
    block_table: list[int]


@dataclass
class StepLayout:
    num_tokens: int
    slot_mapping: list[int]
    decode_block_tables: list[list[int]] = field(default_factory=list)
    decode_context_lens: list[int] = field(default_factory=list)
    prefills: list[PrefillSpan] = field(default_factory=list)


class AttentionBackend(Protocol):
    """Paged causal attention. One instance per engine; `prepare` runs once per step, `forward` per layer."""

    name: str
    # Whether the decode step can be captured in a CUDA graph (then the backend also has
    # `static_metadata` and `prepare_decode`, see triton_backend.py).
    supports_cuda_graphs: bool

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
    ) -> list[LayerKVCache]: ...

    def prepare(self, layout: StepLayout, block_size: int, device: torch.device) -> Any:
        """Turn the step layout into whatever tensors `forward` needs (built once, used by every layer)."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: Any,
    ) -> torch.Tensor:
        """q: [T, heads, head_dim], k/v: [T, kv_heads, head_dim] for the step's new tokens;
        `kv_cache` is this layer's pair, so a backend needs no layer index.

        Writes k/v into the cache, returns the attention output [T, heads, head_dim].
        """
        ...


def kv_cache_bytes_per_block(
    *, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element


def create_backend(name: str, device: torch.device, *, block_size: int, head_dim: int) -> AttentionBackend:
    """The backend called `name`; "auto" is the fastest one installed for this device and cache shape
    (see `resolve_backend`)."""
    from regional_node.engine.config import ATTENTION_BACKENDS
    from regional_node.engine.errors import EngineConfigError

    if name == "auto":
        name = resolve_backend(device, block_size=block_size, head_dim=head_dim)
    if name == "torch":
        from regional_node.engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "vllm":
        # Imported only here: vLLM's import alone takes seconds and pulls in torch's compiler.
        from regional_node.engine.attention.vllm_backend import VllmAttentionBackend

        return VllmAttentionBackend(device)
    if name == "triton":
        # Imported only here: a node on the torch backend never loads triton.
        try:
            from regional_node.engine.attention.triton_backend import TritonAttentionBackend
        except ModuleNotFoundError as exc:
            if exc.name != "triton":
                raise
            raise EngineConfigError(
                "attention_backend 'triton' needs the triton package, which is not installed "
                "(pip install 'meridian[gpu]')"
            ) from exc
        return TritonAttentionBackend(device)
    raise EngineConfigError(f"unknown attention_backend {name!r}; available: {', '.join(ATTENTION_BACKENDS)}")


def resolve_backend(device: torch.device, *, block_size: int, head_dim: int) -> str:
    """What "auto" means. CPU: vLLM's kernels when vLLM is installed and supports the cache shape
    (block_size a multiple of 16, a head size its kernels have), else torch; measured faster than
    torch on every shape the benchmark runs (benchmarks/engine_vs_vllm.py). CUDA: triton when
    installed (its decode steps replay CUDA graphs), else vLLM's FlashAttention when the GPU build
    is installed, else torch."""
    import importlib.util

    from regional_node.engine.attention.vllm_backend import unsupported_reason

    has_vllm = importlib.util.find_spec("vllm") is not None
    vllm_fits = has_vllm and unsupported_reason(device, block_size=block_size, head_dim=head_dim) is None
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is not None:
            return "triton"
        return "vllm" if vllm_fits and _has_flash_attention() else "torch"
    return "vllm" if vllm_fits else "torch"


def _has_flash_attention() -> bool:
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func  # noqa: F401
    except ImportError:
        return False
    return True


def zeroed_kv_cache(
    *,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> list[LayerKVCache]:
    """Per layer, K and V as [num_kv_heads, num_blocks, block_size, head_dim], the layout every
    backend shares. Zeroed, not empty: padding gets zero weight, and 0 * NaN garbage would
    still be NaN."""
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]

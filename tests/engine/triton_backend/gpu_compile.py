"""Compiles the triton backend's kernels ahead of time for a CUDA GPU, with no GPU present.

    python -m tests.engine.triton_backend.gpu_compile 90     # sm_90 (H100); prints one line per kernel

Triton lowers the kernels through its IR passes, LLVM and its bundled ptxas to a cubin: what the
interpreter-based tests cannot see (unsupported constructs, shape rules of tl.dot on tensor cores,
type errors in the compiled path). Must run in a process where TRITON_INTERPRET is unset, since
the interpreter replaces the kernels before they can be compiled.
"""

from __future__ import annotations

import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from regional_node.engine.attention import triton_kernels as kernels

HEAD_DIM = 64
ATTENTION_ARGS = {
    "block_tables_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "query_start_ptr": "*i32",
    "part_acc_ptr": "*fp32",
    "part_max_ptr": "*fp32",
    "part_sum_ptr": "*fp32",
    "scale_log2": "fp32",
    "num_seqs": "i32",
    "stride_q_token": "i32",
    "stride_q_head": "i32",
    "stride_o_token": "i32",
    "stride_o_head": "i32",
    "stride_cache_head": "i64",
    "stride_cache_block": "i32",
    "stride_cache_slot": "i32",
    "stride_table": "i32",
}


def compile_kernel(
    fn: object, args: dict[str, str], constants: dict[str, object], target: GPUTarget
) -> object:
    signature = {**args, **dict.fromkeys(constants, "constexpr")}
    return triton.compile(ASTSource(fn, signature, constexprs=constants), target=target)


def main(argv: list[str]) -> int:
    assert os.environ.get("TRITON_INTERPRET", "0") != "1" and not kernels.INTERPRETED
    target = GPUTarget("cuda", int(argv[0]) if argv else 90, 32)
    # (dtype, BLOCK_M, GROUP, NUM_SEGMENTS): a Qwen2.5-0.5B-like group of 7; decode, split decode, prefill.
    variants = [
        ("bf16", 16, 7, 1),
        ("bf16", 16, 7, 16),
        ("bf16", 64, 7, 1),
        ("fp16", 16, 2, 4),
        ("fp32", 64, 4, 1),
    ]
    for dtype, block_m, group, segments in variants:
        pointer = f"*{dtype}"
        attention = compile_kernel(
            kernels._paged_attention_kernel,
            {name: pointer for name in ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")} | ATTENTION_ARGS,
            {
                "GROUP": group,
                "HEAD_DIM": HEAD_DIM,
                "DIM_P": HEAD_DIM,
                "BLOCK_SIZE": 16,
                "BLOCK_M": block_m,
                "BLOCK_Q": block_m // group,
                "TILE": 32,
                "NUM_SEGMENTS": segments,
                "IEEE": dtype == "fp32",
                "UPCAST": False,
            },
            target,
        )
        print(
            f"paged_attention {dtype} BLOCK_M={block_m} segments={segments}: cubin {len(attention.asm['cubin'])} bytes"
        )
    write = compile_kernel(
        kernels._write_kv_kernel,
        {name: "*bf16" for name in ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr")}
        | {"slot_mapping_ptr": "*i64"}
        | dict.fromkeys(("stride_k_token", "stride_k_head", "stride_v_token", "stride_v_head"), "i32")
        | {"stride_cache_head": "i64", "stride_cache_block": "i32", "stride_cache_slot": "i32"},
        {"NUM_KV_HEADS": 2, "HEAD_DIM": HEAD_DIM, "HEADS_P": 2, "DIM_P": HEAD_DIM, "BLOCK_SIZE": 16},
        target,
    )
    print(f"write_kv bf16: cubin {len(write.asm['cubin'])} bytes")
    merge = compile_kernel(
        kernels._merge_segments_kernel,
        {"out_ptr": "*bf16", "part_acc_ptr": "*fp32", "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32"}
        | {"stride_o_token": "i32", "stride_o_head": "i32"},
        {"HEAD_DIM": HEAD_DIM, "DIM_P": HEAD_DIM, "NUM_SEGMENTS": 16},
        target,
    )
    print(f"merge_segments bf16: cubin {len(merge.asm['cubin'])} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

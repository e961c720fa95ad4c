"""Engine throughput and latency: our LLMEngine vs transformers, on one local checkpoint.

    .venv/bin/python benchmarks/engine_throughput.py [--quick] [--device cpu] [--dtype float32] [--threads N]

Scenario 1 (mixed): requests with mixed prompt and output lengths, all arriving at t=0, EOS
ignored so every system generates exactly the same number of tokens, greedy. Systems: ours
(stepped by hand), transformers `generate` on static left-padded batches, and transformers'
continuous batching. Reports output tokens/s, TTFT p50/p99 and ITL p50/p99.
Scenario 2 (prefix): a shared system prompt plus distinct user suffixes, ours with prefix caching
on vs off; reports TTFT p50 of each and their ratio.
Writes benchmarks/results/engine_throughput.json and prints a table with the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from engine_bench.meridian import load_engine, run_meridian
from engine_bench.result import token_agreement
from engine_bench.transformers_baselines import load_hf_model, run_continuous_batching, run_static_batches
from engine_bench.workload import describe, mixed_workload, shared_prefix_workload

from regional_node.checkpoints import init_checkpoint

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "engine_throughput.json"
CHECKPOINT_CACHE = REPO / ".meridian" / "benchmarks" / "checkpoints"

TARGETS = {
    "throughput_vs_static_batching": 3.0,
    "throughput_vs_generate_batch": 1.2,
    "prefix_caching_ttft_p50_speedup": 2.0,
}


def ensure_checkpoint(arch: str, size: str, seed: int = 0) -> Path:
    """The benchmark model in a cache folder (never downloaded).

    Rewritten on every run: it takes well under a second and can never go stale when the
    checkpoint writer changes.
    """
    return init_checkpoint(
        CHECKPOINT_CACHE / f"{arch}-{size}-seed{seed}", arch=arch, size=size, seed=seed, force=True
    )


def mixed_scenario(
    checkpoint: Path,
    *,
    num_requests: int,
    seed: int,
    device: str,
    dtype: str,
    prompt_range: tuple[int, int] = (16, 512),
    output_range: tuple[int, int] = (8, 256),
    static_batch_size: int = 8,
    max_num_batched_tokens: int = 2048,
) -> dict[str, Any]:
    vocab_size = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    requests = mixed_workload(
        num_requests, vocab_size=vocab_size, seed=seed, prompt_range=prompt_range, output_range=output_range
    )
    engine = load_engine(
        checkpoint,
        device=device,
        dtype=dtype,
        enable_prefix_caching=True,
        max_num_seqs=max(num_requests, 1),
        max_num_batched_tokens=max_num_batched_tokens,
    )
    ours = run_meridian(engine, requests, warmup_prompt=list(range(3, 19)))
    del engine
    model = load_hf_model(checkpoint, device=device, dtype=dtype)
    static = run_static_batches(model, requests, batch_size=static_batch_size)
    continuous = run_continuous_batching(
        model, requests, max_batch_tokens=max_num_batched_tokens, max_requests_per_batch=num_requests
    )
    return {
        "workload": describe(requests),
        "systems": {
            "meridian": ours.report(),
            "hf_static_batching": static.report(),
            "hf_continuous_batching": continuous.report(),
        },
        # Greedy tokens should match; a mismatch points at a correctness bug, not a timing one.
        "token_agreement_with_meridian": {
            "hf_static_batching": token_agreement(ours, static),
            "hf_continuous_batching": token_agreement(ours, continuous),
        },
    }


def prefix_scenario(
    checkpoint: Path,
    *,
    num_requests: int,
    seed: int,
    device: str,
    dtype: str,
    prefix_len: int = 256,
    suffix_range: tuple[int, int] = (16, 64),
    max_tokens: int = 8,
    max_num_batched_tokens: int = 2048,
) -> dict[str, Any]:
    vocab_size = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    prefix, requests = shared_prefix_workload(
        num_requests,
        vocab_size=vocab_size,
        seed=seed,
        prefix_len=prefix_len,
        suffix_range=suffix_range,
        max_tokens=max_tokens,
    )
    runs = {}
    for caching in (True, False):
        engine = load_engine(
            checkpoint,
            device=device,
            dtype=dtype,
            enable_prefix_caching=caching,
            max_num_seqs=max(num_requests, 1),
            max_num_batched_tokens=max_num_batched_tokens,
        )
        # Warm-up = one earlier request with the same system prompt, as in a running deployment.
        runs[caching] = run_meridian(engine, requests, warmup_prompt=[*prefix, 3, 4, 5, 6])
        del engine
    on, off = runs[True].summary(), runs[False].summary()
    return {
        "workload": {**describe(requests), "shared_prefix_tokens": prefix_len},
        "prefix_caching_on": runs[True].report(),
        "prefix_caching_off": runs[False].report(),
        "ttft_p50_speedup": off.ttft_p50_s / on.ttft_p50_s,
        "token_agreement_on_vs_off": token_agreement(runs[True], runs[False]),
    }


def target_checks(mixed: dict[str, Any], prefix: dict[str, Any]) -> dict[str, Any]:
    """Wall-clock ratios decide; throughput ratios per CPU-second ride along as the noise-robust view."""
    systems = mixed["systems"]

    def ratio(key: str, baseline: str) -> float:
        return systems["meridian"][key] / systems[baseline][key]

    checks = {}
    for name, baseline in (
        ("throughput_vs_static_batching", "hf_static_batching"),
        ("throughput_vs_generate_batch", "hf_continuous_batching"),
    ):
        value = ratio("output_tokens_per_s", baseline)
        checks[name] = {
            "value": round(value, 3),
            "value_per_cpu_s": round(ratio("output_tokens_per_cpu_s", baseline), 3),
            "target": TARGETS[name],
            "met": value >= TARGETS[name],
        }
    speedup = prefix["ttft_p50_speedup"]
    checks["prefix_caching_ttft_p50_speedup"] = {
        "value": round(speedup, 3),
        "target": TARGETS["prefix_caching_ttft_p50_speedup"],
        "met": speedup >= TARGETS["prefix_caching_ttft_p50_speedup"],
    }
    return checks


def conditions(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    import transformers

    config = json.loads((checkpoint / "config.json").read_text())
    return {
        "checkpoint": str(checkpoint),
        "architecture": config["architectures"][0],
        "hidden_size": config["hidden_size"],
        "num_hidden_layers": config["num_hidden_layers"],
        "vocab_size": config["vocab_size"],
        "device": args.device,
        "dtype": args.dtype,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": _load_average(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "quick": args.quick,
        "seed": args.seed,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def render_table(result: dict[str, Any]) -> str:
    header = ("system", "tok/s", "tok/cpu-s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99")
    rows = ["{:<24}{:>9}{:>11}{:>10}{:>10}{:>10}{:>10}".format(*header)]
    for name, s in result["mixed"]["systems"].items():
        rows.append(
            f"{name:<24}{s['output_tokens_per_s']:>9.1f}{s['output_tokens_per_cpu_s']:>11.1f}"
            f"{s['ttft_p50_s']:>9.2f}s{s['ttft_p99_s']:>9.2f}s"
            f"{s['itl_p50_s'] * 1000:>8.1f}ms{s['itl_p99_s'] * 1000:>8.1f}ms"
        )
    prefix = result["prefix"]
    rows.append(
        f"prefix caching: TTFT p50 on {prefix['prefix_caching_on']['ttft_p50_s']:.3f}s, "
        f"off {prefix['prefix_caching_off']['ttft_p50_s']:.3f}s"
    )
    for name, check in result["targets"].items():
        per_cpu = f", {check['value_per_cpu_s']:.2f}x per cpu-s" if "value_per_cpu_s" in check else ""
        verdict = "ok" if check["met"] else "MISSED"
        rows.append(f"{name:<34}{check['value']:>6.2f}x  (target >= {check['target']}x) {verdict}{per_cpu}")
    return "\n".join(rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 short mixed requests, 8 prefix requests")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads, the same for every system (default 1: on a shared CPU, more threads "
        "mostly measure contention — one busy core makes every parallel matmul wait for it)",
    )
    parser.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    parser.add_argument("--size", default="small")
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="use this folder instead of a cached one"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    parser.add_argument("--static-batch-size", type=int, default=8)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    checkpoint = args.checkpoint or ensure_checkpoint(args.arch, args.size)
    # Captured before the runs: other work on a shared machine shows up in the load average.
    run_conditions = conditions(args, checkpoint)
    common = {"seed": args.seed, "device": args.device, "dtype": args.dtype}
    if args.quick:
        mixed = mixed_scenario(
            checkpoint,
            num_requests=16,
            prompt_range=(16, 256),
            output_range=(8, 64),
            static_batch_size=args.static_batch_size,
            **common,
        )
        prefix = prefix_scenario(checkpoint, num_requests=8, **common)
    else:
        mixed = mixed_scenario(
            checkpoint, num_requests=64, static_batch_size=args.static_batch_size, **common
        )
        prefix = prefix_scenario(checkpoint, num_requests=32, **common)
    result = {
        "conditions": {**run_conditions, "load_average_at_end": _load_average()},
        "mixed": mixed,
        "prefix": prefix,
        "targets": target_checks(mixed, prefix),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(render_table(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

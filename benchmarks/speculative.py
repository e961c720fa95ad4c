"""Speculative decoding (prompt lookup, `ngram`) against speculation off, in one process.

    .venv/bin/python benchmarks/speculative.py [--rounds 3] [--max-tokens 96] [--threads 2] [--quick]

Model: the demo's trained large tier (`mini` Llama, trained on the checkpoint corpus; written
once into .meridian/benchmarks/checkpoints by `python -m regional_node.checkpoints init --train`).
Workloads:
- input-grounded: "Repeat the paragraph." + a corpus paragraph + its first words: the answer
  quotes the prompt (greedy);
- open-ended: a paragraph's opening words and free continuation, sampled (temperature 1.0, a
  seed per request), so the text is not a copy of anything.
Batch sizes 1, 4 and 16 (all requests arrive at once). Off and ngram engines are loaded once and
run alternately, round by round, so both see the same machine load; every ratio is taken within
a round and the median over rounds is reported. Metrics: decode tok/s (tokens after each
request's first / time from the batch's last first token to its end), TTFT p50, ITL p50/p99
(a step that emits several tokens counts as that many inter-token gaps of equal share),
acceptance rate and mean acceptance length.

Writes benchmarks/results/speculative.json, a table on stdout and benchmarks/results/speculative.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from regional_node.engine import LLMEngine, SamplingParams

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = REPO / ".meridian" / "benchmarks" / "checkpoints" / "llama-mini-trained"
CORPUS = REPO / "regional_node" / "checkpoints" / "corpus.txt"
OUT = REPO / "benchmarks" / "results" / "speculative.json"
BATCH_SIZES = (1, 4, 16)
GOALS = {
    ("input-grounded", 1): 2.0,
    ("open-ended", 1): 0.95,
    ("input-grounded", 16): 0.95,
    ("open-ended", 16): 0.95,
}


def ensure_checkpoint() -> Path:
    if not (CHECKPOINT / "model.safetensors").is_file():
        cmd = [sys.executable, "-m", "regional_node.checkpoints", "init", str(CHECKPOINT)]
        subprocess.run([*cmd, "--arch", "llama", "--size", "mini", "--train", "--force"], check=True)
    return CHECKPOINT


def paragraphs() -> list[str]:
    text = CORPUS.read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if len(p.strip()) > 300]


def workload(kind: str, batch: int, max_tokens: int, offset: int) -> list[tuple[str, SamplingParams]]:
    paras = paragraphs()
    out = []
    for i in range(batch):
        para = paras[(offset + i) % len(paras)][:500]
        if kind == "input-grounded":
            prompt = f"Repeat the paragraph.\n\n{para}\n\n{para[:60]}"
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=False)
        else:
            prompt = para[:60]
            params = SamplingParams(
                max_tokens=max_tokens, temperature=1.0, seed=offset + i, ignore_eos=True, logprobs=False
            )
        out.append((prompt, params))
    return out


def run_batch(engine: LLMEngine, requests: list[tuple[str, SamplingParams]]) -> dict[str, Any]:
    before = engine.stats()
    start = time.perf_counter()
    first: dict[str, float] = {}
    counts: dict[str, int] = {}
    gaps: list[float] = []
    last: dict[str, float] = {}
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished_requests():
        deltas = engine.step()
        now = time.perf_counter()
        for d in deltas:
            n = len(d.new_token_ids)
            if not n:
                continue
            if d.request_id not in first:
                first[d.request_id] = now
                n -= 1
            elif n:
                gaps.extend([(now - last[d.request_id]) / n] * n)
            counts[d.request_id] = counts.get(d.request_id, 0) + len(d.new_token_ids)
            last[d.request_id] = now
    end = time.perf_counter()
    after = engine.stats()
    decode_tokens = sum(counts.values()) - len(counts)
    drafts = after.get("spec_decode_num_drafts", 0) - before.get("spec_decode_num_drafts", 0)
    drafted = after.get("spec_decode_num_draft_tokens", 0) - before.get("spec_decode_num_draft_tokens", 0)
    accepted = after.get("spec_decode_num_accepted_tokens", 0) - before.get(
        "spec_decode_num_accepted_tokens", 0
    )
    gaps.sort()
    return {
        "decode_tok_s": decode_tokens / (end - max(first.values())),
        "ttft_p50_ms": 1000 * statistics.median(t - start for t in first.values()),
        "itl_p50_ms": 1000 * gaps[len(gaps) // 2] if gaps else 0.0,
        "itl_p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else 0.0,
        "verifications": drafts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 round, 48 tokens")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.max_tokens = 1, 48
    torch.set_num_threads(args.threads)
    path = ensure_checkpoint()
    engines = {
        "off": LLMEngine.from_pretrained(path),
        "ngram": LLMEngine.from_pretrained(path, speculative={"method": "ngram"}),
        # The per-step back-off's evidence: the same proposer with no batch-size limit.
        "ngram_no_step_backoff": LLMEngine.from_pretrained(
            path, speculative={"method": "ngram", "max_batch_size": 1024}
        ),
    }
    for engine in engines.values():  # untimed warm-up
        run_batch(engine, workload("input-grounded", 2, 8, 0))
    rows = []
    for kind in ("input-grounded", "open-ended"):
        for batch in BATCH_SIZES:
            names = ["off", "ngram"] + (["ngram_no_step_backoff"] if batch > 1 else [])
            per_round: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for name in names:  # untimed: first-use allocations for this workload's shapes
                run_batch(engines[name], workload(kind, batch, args.max_tokens, args.rounds))
            for r in range(args.rounds):
                for name in names if r % 2 == 0 else names[::-1]:
                    per_round[name].append(
                        run_batch(engines[name], workload(kind, batch, args.max_tokens, r))
                    )
            row = {
                "workload": kind,
                "batch": batch,
                "speedup_decode_tok_s": median_ratio(per_round, "ngram"),
                "speedups_per_round": ratios(per_round, "ngram"),
                "speedup_without_step_backoff": median_ratio(per_round, "ngram_no_step_backoff"),
                "goal": GOALS.get((kind, batch)),
                **{
                    f"{name}_{key}": statistics.median(run[key] for run in runs)
                    for name, runs in per_round.items()
                    for key in runs[0]
                },
            }
            rows.append(row)
            print(
                f"{kind:15s} batch {batch:2d}: {row['speedup_decode_tok_s']:.2f}x  ({row['off_decode_tok_s']:.1f} -> "
                f"{row['ngram_decode_tok_s']:.1f} tok/s, acceptance {row['ngram_acceptance_rate']:.2f}, "
                f"mean length {row['ngram_mean_acceptance_length']:.2f})",
                flush=True,
            )
    report = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "load_avg": os.getloadavg(),
        },
        "checkpoint": "llama mini, trained (regional_node.checkpoints --train)",
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "speculative": {
            "method": "ngram",
            **{k: v for k, v in vars(engines["ngram"].engine_config.speculative).items()},
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(rows)
    plot(rows, args.out.with_suffix(".png"))


def ratios(per_round: dict[str, list[dict[str, Any]]], name: str) -> list[float]:
    """decode tok/s of `name` over off's, round by round (each round saw the same load)."""
    return [
        n["decode_tok_s"] / o["decode_tok_s"]
        for o, n in zip(per_round["off"], per_round.get(name, []), strict=False)
    ]


def median_ratio(per_round: dict[str, list[dict[str, Any]]], name: str) -> float | None:
    values = ratios(per_round, name)
    return statistics.median(values) if values else None


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        "workload",
        "batch",
        "speed-up",
        "goal",
        "without step back-off",
        "off tok/s",
        "ngram tok/s",
        "accept",
        "mean len",
        "TTFT off/ngram ms",
        "ITL p50 off/ngram",
        "ITL p99 off/ngram",
    )
    print(" | ".join(head))
    for r in rows:
        goal = f">= {r['goal']}" if r["goal"] else ""
        print(
            " | ".join(
                [
                    r["workload"],
                    str(r["batch"]),
                    f"{r['speedup_decode_tok_s']:.2f}x",
                    goal,
                    f"{r['speedup_without_step_backoff']:.2f}x" if r["speedup_without_step_backoff"] else "",
                    f"{r['off_decode_tok_s']:.1f}",
                    f"{r['ngram_decode_tok_s']:.1f}",
                    f"{r['ngram_acceptance_rate']:.2f}",
                    f"{r['ngram_mean_acceptance_length']:.2f}",
                    f"{r['off_ttft_p50_ms']:.0f}/{r['ngram_ttft_p50_ms']:.0f}",
                    f"{r['off_itl_p50_ms']:.1f}/{r['ngram_itl_p50_ms']:.1f}",
                    f"{r['off_itl_p99_ms']:.1f}/{r['ngram_itl_p99_ms']:.1f}",
                ]
            )
        )


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in ("input-grounded", "open-ended"):
        mine = [r for r in rows if r["workload"] == kind]
        ax.plot([r["batch"] for r in mine], [r["speedup_decode_tok_s"] for r in mine], marker="o", label=kind)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode tok/s, ngram / off")
    ax.set_title("Prompt-lookup speculative decoding (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()

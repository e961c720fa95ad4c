"""Speculative decoding (prompt lookup `ngram`, or a `draft` model) against speculation off, in one process.

    .venv/bin/python benchmarks/speculative.py [--method ngram|draft] [--rounds 3] [--max-tokens 96]
        [--threads 2] [--batch-sizes 1 4 16] [--quick]

Model: the demo's trained large tier (`mini` Llama, trained on the checkpoint corpus; written
once into .meridian/benchmarks/checkpoints by `python -m regional_node.checkpoints init --train`).
`--method draft` drafts with the demo's trained small tier (`tiny` Llama, same tokenizer): the
`make up` pair; it also runs the draft model alone, whose speed against the target's gives the
break-even acceptance rate of the pair (see break_even_acceptance).
Workloads:
- input-grounded: "Repeat the paragraph." + a corpus paragraph + its first words: the answer
  quotes the prompt (greedy);
- open-ended: a paragraph's opening words and free continuation, sampled (temperature 1.0, a
  seed per request), so the text is not a copy of anything.
Batch sizes 1, 4 and 16 (all requests arrive at once). The engines are loaded once and
run alternately, round by round, so all see the same machine load; every ratio is taken within
a round and the median over rounds is reported. Metrics: decode tok/s (tokens after each
request's first / time from the batch's last first token to its end), TTFT p50, ITL p50/p99
(a step that emits several tokens counts as that many inter-token gaps of equal share),
acceptance rate and mean acceptance length.

Writes benchmarks/results/speculative.json (speculative-draft.json for draft), a table on stdout
and a plot beside the JSON (.png).
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
DRAFT_CHECKPOINT = REPO / ".meridian" / "benchmarks" / "checkpoints" / "llama-tiny-trained"
CORPUS = REPO / "regional_node" / "checkpoints" / "corpus.txt"
OUT = REPO / "benchmarks" / "results" / "speculative.json"
DRAFT_OUT = REPO / "benchmarks" / "results" / "speculative-draft.json"
BATCH_SIZES = (1, 4, 16)
GOALS = {
    ("input-grounded", 1): 2.0,
    ("open-ended", 1): 0.95,
    ("input-grounded", 16): 0.95,
    ("open-ended", 16): 0.95,
}


def ensure_checkpoint(path: Path, size: str) -> Path:
    """The demo's trained checkpoint of this size (default training steps: the `make up` models)."""
    if not (path / "model.safetensors").is_file():
        cmd = [sys.executable, "-m", "regional_node.checkpoints", "init", str(path)]
        subprocess.run([*cmd, "--arch", "llama", "--size", size, "--train", "--force"], check=True)
    return path


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


def engines_for(method: str, path: Path) -> dict[str, LLMEngine]:
    """The engines one run compares with speculation off: the method's variants."""
    if method == "ngram":
        return {
            "ngram": LLMEngine.from_pretrained(path, speculative={"method": "ngram"}),
            # The per-step back-off's evidence: the same proposer with no batch-size limit.
            "ngram_no_step_backoff": LLMEngine.from_pretrained(
                path, speculative={"method": "ngram", "max_batch_size": 1024}
            ),
        }
    draft = ensure_checkpoint(DRAFT_CHECKPOINT, "tiny")
    return {
        "draft": LLMEngine.from_pretrained(path, speculative={"method": "draft", "draft_model": str(draft)}),
        # One token per draft: the cheapest verification, the lowest break-even acceptance.
        "draft_k1": LLMEngine.from_pretrained(
            path, speculative={"method": "draft", "draft_model": str(draft), "num_speculative_tokens": 1}
        ),
        # The draft model alone, no speculation: its decode speed against the target's gives the
        # cost ratio behind the break-even acceptance.
        "draft_model_alone": LLMEngine.from_pretrained(draft),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--method", choices=("ngram", "draft"), default="ngram")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1 round, 48 tokens")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--out", type=Path, default=None, help=f"default: {OUT} (ngram), {DRAFT_OUT} (draft)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.max_tokens = 1, 48
    out_path = args.out or (OUT if args.method == "ngram" else DRAFT_OUT)
    torch.set_num_threads(args.threads)
    path = ensure_checkpoint(CHECKPOINT, "mini")
    engines = {"off": LLMEngine.from_pretrained(path), **engines_for(args.method, path)}
    spec_name = args.method
    spec_config = engines[spec_name].engine_config.speculative
    assert spec_config is not None
    for engine in engines.values():  # untimed warm-up
        run_batch(engine, workload("input-grounded", 2, 8, 0))
    rows = []
    for kind in ("input-grounded", "open-ended"):
        for batch in args.batch_sizes:
            names = [n for n in engines if batch > 1 or n != "ngram_no_step_backoff"]
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
                "method": spec_name,
                "speedup_decode_tok_s": median_ratio(per_round, spec_name),
                "speedups_per_round": ratios(per_round, spec_name),
                "goal": GOALS.get((kind, batch)) if spec_name == "ngram" else None,
                **{
                    f"speedup_{name}": median_ratio(per_round, name)
                    for name in names
                    if name not in ("off", spec_name)
                },
                **{
                    f"{name}_{key}": statistics.median(run[key] for run in runs)
                    for name, runs in per_round.items()
                    for key in runs[0]
                },
            }
            if spec_name == "draft":
                k = spec_config.num_speculative_tokens
                # Modelled: a draft step's cost from the draft model's own speed, verification as
                # one plain step. Measured: a drafting step's cost in plain steps, from what it
                # achieved (tokens per verification / speed-up).
                cost_ratio = row["off_decode_tok_s"] / row["draft_model_alone_decode_tok_s"]
                row["draft_step_cost_ratio"] = cost_ratio
                row["break_even_acceptance"] = break_even_acceptance(1 + k * cost_ratio, k)
                row["break_even_acceptance_k1"] = break_even_acceptance(1 + cost_ratio, 1)
                for name, n in (("draft", k), ("draft_k1", 1)):
                    speedup, length = (
                        row["speedup_decode_tok_s" if name == "draft" else "speedup_draft_k1"],
                        row[f"{name}_mean_acceptance_length"],
                    )
                    cost = length / speedup if speedup and length else None
                    row[f"{name}_step_cost_measured"] = cost
                    row[f"{name}_break_even_acceptance_measured"] = (
                        break_even_acceptance(cost, n) if cost else None
                    )
            rows.append(row)
            print(
                f"{kind:15s} batch {batch:2d}: {row['speedup_decode_tok_s']:.2f}x  ({row['off_decode_tok_s']:.1f} -> "
                f"{row[spec_name + '_decode_tok_s']:.1f} tok/s, acceptance {row[spec_name + '_acceptance_rate']:.2f}, "
                f"mean length {row[spec_name + '_mean_acceptance_length']:.2f})",
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
        "draft_checkpoint": "llama tiny, trained (the `make up` pair)" if spec_name == "draft" else None,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "speculative": {"method": spec_name, **vars(spec_config)},
        "rows": rows,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print_table(rows, spec_name)
    plot(rows, out_path.with_suffix(".png"), spec_name)


def break_even_acceptance(step_cost: float, k: int) -> float:
    """The per-token acceptance rate a at which drafting k tokens breaks even (Leviathan et al.
    2023): a verification yields 1 + a + ... + a^k tokens for `step_cost` plain decode steps
    (k draft steps plus the verification). NaN: no rate pays (a cost of k + 1 steps or more)."""
    if step_cost >= k + 1:
        return float("nan")
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the expected length grows with a
        mid = (low + high) / 2
        if sum(mid**i for i in range(k + 1)) < step_cost:
            low = mid
        else:
            high = mid
    return low


def ratios(per_round: dict[str, list[dict[str, Any]]], name: str) -> list[float]:
    """decode tok/s of `name` over off's, round by round (each round saw the same load)."""
    return [
        n["decode_tok_s"] / o["decode_tok_s"]
        for o, n in zip(per_round["off"], per_round.get(name, []), strict=False)
    ]


def median_ratio(per_round: dict[str, list[dict[str, Any]]], name: str) -> float | None:
    values = ratios(per_round, name)
    return statistics.median(values) if values else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(rows: list[dict[str, Any]], name: str) -> None:
    head = (
        "workload",
        "batch",
        "speed-up",
        "goal",
        "other variant",
        "off tok/s",
        f"{name} tok/s",
        "accept",
        "mean len",
        f"TTFT off/{name} ms",
        f"ITL p50 off/{name}",
        f"ITL p99 off/{name}",
    )
    print(" | ".join(head))
    for r in rows:
        goal = f">= {r['goal']}" if r["goal"] else ""
        other = ""
        if r.get("speedup_ngram_no_step_backoff"):
            other = f"no step back-off {r['speedup_ngram_no_step_backoff']:.2f}x"
        elif r.get("speedup_draft_model_alone"):
            other = (
                f"k=1 {r['speedup_draft_k1']:.2f}x (accept {r['draft_k1_acceptance_rate']:.2f}); "
                f"draft model alone {r['speedup_draft_model_alone']:.2f}x; break-even acceptance "
                f"modelled {r['break_even_acceptance']:.2f} (k=1 {r['break_even_acceptance_k1']:.2f}), "
                f"measured {_fmt(r['draft_break_even_acceptance_measured'])} "
                f"(k=1 {_fmt(r['draft_k1_break_even_acceptance_measured'])})"
            )
        print(
            " | ".join(
                [
                    r["workload"],
                    str(r["batch"]),
                    f"{r['speedup_decode_tok_s']:.2f}x",
                    goal,
                    other,
                    f"{r['off_decode_tok_s']:.1f}",
                    f"{r[name + '_decode_tok_s']:.1f}",
                    f"{r[name + '_acceptance_rate']:.2f}",
                    f"{r[name + '_mean_acceptance_length']:.2f}",
                    f"{r['off_ttft_p50_ms']:.0f}/{r[name + '_ttft_p50_ms']:.0f}",
                    f"{r['off_itl_p50_ms']:.1f}/{r[name + '_itl_p50_ms']:.1f}",
                    f"{r['off_itl_p99_ms']:.1f}/{r[name + '_itl_p99_ms']:.1f}",
                ]
            )
        )


def plot(rows: list[dict[str, Any]], path: Path, name: str) -> None:
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
    ax.set_ylabel(f"decode tok/s, {name} / off")
    ax.set_title(
        "Prompt-lookup speculative decoding (CPU)"
        if name == "ngram"
        else "Draft-model speculative decoding (CPU)"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()

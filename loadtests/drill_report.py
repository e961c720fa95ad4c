"""The spike drill's verdict, JSON and plot, from the per-request records the drill collected.

Pure apart from writing files (no locust import), so the criteria can be read and checked alone.
A record is one request: when it started (seconds since the drill began), its tier, its HTTP
status, the error code, whether it carried Retry-After, its TTFT (streams) and total latency,
whether it was degraded, and whether it ended cleanly (a stream's [DONE], a complete body).

The pass criteria (issue 14):
1. interactive TTFT p99 of admitted requests during the spike <= 2x the pre-spike p99;
2. no request hangs or times out: each ends as a 200 (degraded or not) or a 429/503 carrying
   Retry-After;
3. batch requests still complete after the spike (at least one 200 that started after it);
4. no 5xx other than the documented 503 `overloaded`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BUCKET_S = 5.0


@dataclass
class Record:
    started_s: float
    tier: str  # interactive, batch
    status: int  # 0: no answer (connection error or client timeout)
    code: str = ""  # the error's code, e.g. overloaded, rate_limit_exceeded
    retry_after: bool = False
    ttft_s: float | None = None
    latency_s: float = 0.0
    degraded: bool = False
    clean: bool = True  # a 200 that ended properly ([DONE] / a full body)

    @property
    def outcome(self) -> str:
        if self.status == 200:
            return ("degraded" if self.degraded else "ok") if self.clean else "broken"
        if self.status == 0:
            return "timeout"
        return f"{self.status} {self.code or '-'}"


@dataclass(frozen=True)
class Phases:
    spike_start_s: float
    spike_end_s: float
    end_s: float

    def of(self, t: float) -> str:
        if t < self.spike_start_s:
            return "before"
        return "spike" if t < self.spike_end_s else "after"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def verdict(records: Sequence[Record], phases: Phases) -> dict[str, Any]:
    def ttfts(phase: str) -> list[float]:
        return [
            r.ttft_s
            for r in records
            if r.tier == "interactive"
            and r.status == 200
            and r.ttft_s is not None
            and phases.of(r.started_s) == phase
        ]

    before, spike = percentile(ttfts("before"), 99), percentile(ttfts("spike"), 99)
    hung = [r for r in records if r.status == 0 or (r.status == 200 and not r.clean)]
    refused_bare = [r for r in records if r.status in (429, 503) and not r.retry_after]
    other = [r for r in records if r.status not in (200, 429, 503) and r.status != 0]
    bad_5xx = [r for r in records if r.status >= 500 and not (r.status == 503 and r.code == "overloaded")]
    batch_after = [
        r for r in records if r.tier == "batch" and r.status == 200 and phases.of(r.started_s) == "after"
    ]
    checks = {
        "interactive_ttft_p99_within_2x": before is not None and spike is not None and spike <= 2 * before,
        "no_hang_or_timeout": not hung,
        "refusals_carry_retry_after": not refused_bare and not other,
        "batch_completes_after_spike": bool(batch_after),
        "no_5xx_but_503_overloaded": not bad_5xx,
    }
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "interactive_ttft_p99_s": {"before": before, "spike": spike},
        "violations": {
            "hung_or_timed_out": len(hung),
            "refused_without_retry_after": len(refused_bare),
            "unexpected_status": dict(Counter(r.status for r in other)),
            "bad_5xx": dict(Counter(f"{r.status} {r.code}" for r in bad_5xx)),
            "batch_200_after_spike": len(batch_after),
        },
    }


def summary(records: Sequence[Record], phases: Phases) -> dict[str, Any]:
    """Per tier and phase: counts by outcome, and TTFT / latency percentiles of 200s."""
    out: dict[str, Any] = {}
    for tier in ("interactive", "batch"):
        for phase in ("before", "spike", "after"):
            rows = [r for r in records if r.tier == tier and phases.of(r.started_s) == phase]
            ok = [r for r in rows if r.status == 200]
            out.setdefault(tier, {})[phase] = {
                "requests": len(rows),
                "outcomes": dict(Counter(r.outcome for r in rows)),
                "ttft_s": _percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
                "latency_s": _percentiles([r.latency_s for r in ok]),
            }
    return out


def series(records: Sequence[Record], end_s: float) -> dict[str, Any]:
    """Per tier, per BUCKET_S of start time: outcome counts and p50/p95/p99 of the 200s' TTFT (or
    latency for requests without one)."""
    buckets = max(1, math.ceil(end_s / BUCKET_S))
    out: dict[str, Any] = {}
    for tier in ("interactive", "batch"):
        rows: list[dict[str, Any]] = []
        for b in range(buckets):
            inside = [
                r for r in records if r.tier == tier and b * BUCKET_S <= r.started_s < (b + 1) * BUCKET_S
            ]
            ok = [r.ttft_s if r.ttft_s is not None else r.latency_s for r in inside if r.status == 200]
            rows.append(
                {
                    "t_s": b * BUCKET_S,
                    "outcomes": dict(Counter(r.outcome for r in inside)),
                    **_percentiles(ok),
                }
            )
        out[tier] = rows
    return out


def _percentiles(values: Iterable[float]) -> dict[str, float | None]:
    values = list(values)
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)}


def write(
    records: Sequence[Record], phases: Phases, out_dir: Path, settings: dict[str, Any]
) -> dict[str, Any]:
    """drill.json (settings, verdict, summary, time series, every record) and drill.png; returns the
    verdict."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "settings": settings,
        "phases": asdict(phases),
        "verdict": verdict(records, phases),
        "summary": summary(records, phases),
        "series": series(records, phases.end_s),
        "records": [asdict(r) for r in records],
    }
    (out_dir / "drill.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    plot(result, out_dir / "drill.png")
    return result["verdict"]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = result["phases"]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    for col, tier in enumerate(("interactive", "batch")):
        rows = result["series"][tier]
        t = [row["t_s"] for row in rows]
        latency = axes[0][col]
        for q in ("p50", "p95", "p99"):
            latency.plot(t, [row[q] if row[q] is not None else math.nan for row in rows], marker=".", label=q)
        latency.set_title(f"{tier}: {'TTFT' if tier == 'interactive' else 'latency'} of 200s (s)")
        latency.legend()
        counts = axes[1][col]
        outcomes = sorted({o for row in rows for o in row["outcomes"]})
        bottom = [0] * len(rows)
        for outcome in outcomes:
            values = [row["outcomes"].get(outcome, 0) for row in rows]
            counts.bar(t, values, width=BUCKET_S * 0.9, bottom=bottom, align="edge", label=outcome)
            bottom = [a + b for a, b in zip(bottom, values, strict=True)]
        counts.set_title(f"{tier}: outcomes per {BUCKET_S:g}s (by start time)")
        counts.set_xlabel("seconds since start")
        counts.legend(fontsize="small")
        for ax in (latency, counts):
            ax.axvspan(phases["spike_start_s"], phases["spike_end_s"], color="red", alpha=0.08)
    verdict_ = result["verdict"]
    fig.suptitle(f"Meridian spike drill: {'PASS' if verdict_['passed'] else 'FAIL'}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

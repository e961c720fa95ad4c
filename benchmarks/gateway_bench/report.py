"""From measured runs to the numbers the benchmark reports: percentiles, added latency, targets.

Pure: no I/O except `table`, which only formats. Samples of a phase are pooled over its rounds
before percentiles are taken; requests/s is pooled successes over pooled measured wall time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gateway_bench.runner import Phase, Run, RunTable

# The targets of issue 31 ("Fast on the wire"), against LiteLLM's proxy in front of the same
# upstream, in the same run.
TARGETS = {
    # LiteLLM's added p50 latency (non-streamed, concurrency 1) / Meridian's.
    "p50_added_latency_ratio": 30.0,
    # LiteLLM's CPU per non-streamed request at concurrency 32 / Meridian's.
    "proxy_cpu_per_request_ratio": 40.0,
    # Meridian's requests/s at concurrency 32 / LiteLLM's.
    "requests_per_s_ratio": 40.0,
}
ADDED_KEYS = (
    ("chat_c1", "latency", "p50"),
    ("chat_c1", "latency", "p99"),
    ("chat_c32", "latency", "p50"),
    ("chat_c32", "latency", "p99"),
    ("stream_c1", "ttfb", "p50"),
    ("stream_c1", "ttfb", "p99"),
)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _ms(seconds: float) -> float | None:
    return None if math.isnan(seconds) else round(seconds * 1000, 3)


def summarize_phase(phase: Phase, runs: Sequence[Run]) -> dict[str, Any]:
    latencies = [x for run in runs for x in run.result.latencies_s]
    ttfb = [x for run in runs for x in run.result.ttfb_s]
    ok = sum(run.result.ok for run in runs)
    wall = sum(run.result.wall_s for run in runs)
    sent = sum(run.sent for run in runs)
    summary: dict[str, Any] = {
        "requests": ok,
        "errors": sum(run.result.errors for run in runs),
        "truncated": any(run.result.truncated for run in runs),
        "latency_p50_ms": _ms(percentile(latencies, 50)),
        "latency_p99_ms": _ms(percentile(latencies, 99)),
        "latency_mean_ms": _ms(sum(latencies) / len(latencies)) if latencies else None,
        "requests_per_s": round(ok / wall, 1) if wall > 0 else None,
        # Near 1.0 would mean the load generator, not the system, set the pace.
        "client_cpu_fraction": round(sum(r.result.client_cpu_s for r in runs) / wall, 3)
        if wall > 0
        else None,
        # The system's own CPU per request: the least noise-sensitive cost measure on a shared host.
        "proxy_cpu_ms_per_request": round(sum(r.proxy_cpu_s for r in runs) / sent * 1000, 4)
        if sent
        else None,
        "per_round": [
            {
                "latency_p50_ms": _ms(percentile(run.result.latencies_s, 50)),
                "requests_per_s": round(run.result.ok / run.result.wall_s, 1)
                if run.result.wall_s > 0
                else None,
            }
            for run in runs
        ],
    }
    if phase.stream:
        summary["ttfb_p50_ms"] = _ms(percentile(ttfb, 50))
        summary["ttfb_p99_ms"] = _ms(percentile(ttfb, 99))
    samples = [s for run in runs for s in run.result.error_samples]
    if samples:
        summary["error_samples"] = samples[:5]
    return summary


def summarize(table: RunTable, phases: Sequence[Phase]) -> dict[str, dict[str, Any]]:
    return {
        system: {
            phase.name: summarize_phase(phase, runs[phase.name]) for phase in phases if phase.name in runs
        }
        for system, runs in table.items()
    }


def scaling(systems: dict[str, dict[str, Any]], workers: int) -> dict[str, Any]:
    """Throughput of `meridian --workers N` against one worker, in the phases both ran."""
    one, many = systems["meridian"], systems[f"meridian_w{workers}"]
    result: dict[str, Any] = {"workers": workers}
    for phase in many:
        rate_one, rate_many = one[phase]["requests_per_s"], many[phase]["requests_per_s"]
        result[phase] = {
            "requests_per_s_1_worker": rate_one,
            f"requests_per_s_{workers}_workers": rate_many,
            "speedup": _ratio(rate_many, rate_one),
        }
    return result


# The issue's absolute targets for Meridian alone (issue 10, "Speed"): (comparison, bound).
GOALS: dict[str, tuple[str, float]] = {
    "chat_c1_added_latency_p50_ms": ("<=", 1.0),
    "chat_c32_requests_per_s": (">=", 1200.0),
    "stream_c32_streams_per_s": (">=", 500.0),
    "chat_c32_cpu_ms_per_request": ("<=", 0.8),
    # Issue 31: the relay's CPU per stream chunk (an H100 node streams over 10k tokens/s).
    "cpu_ms_per_relayed_chunk": ("<=", 0.01),
    "rss_mb_after_all_requests": ("<=", 100.0),
    # "No growth": within what allocator arenas and GC timing move between two reads.
    "rss_growth_mb_second_half": ("<=", 2.0),
}


def per_chunk(systems: dict[str, dict[str, Any]], extra_chunks: int) -> dict[str, float | None]:
    """Each system's CPU per relayed stream chunk: its CPU per long stream (stream_c32_long) minus
    per ordinary one (stream_c32), over the chunks the long one has more. A stream's opening and
    settling cost the same in both, so they drop out."""
    out: dict[str, float | None] = {}
    for name, phases in systems.items():
        long = phases.get("stream_c32_long", {}).get("proxy_cpu_ms_per_request")
        short = phases.get("stream_c32", {}).get("proxy_cpu_ms_per_request")
        out[name] = None if long is None or short is None else round((long - short) / extra_chunks, 5)
    return out


def goals(
    systems: dict[str, dict[str, Any]],
    added: dict[str, dict[str, float | None]],
    rss: dict[str, Any] | None,
    chunk_cpu: dict[str, float | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each goal with the measured value and whether it is met (None: not measured this run)."""
    meridian = systems["meridian"]
    measured: dict[str, float | None] = {
        "chat_c1_added_latency_p50_ms": added["meridian"]["chat_c1_latency_p50_ms"],
        "chat_c32_requests_per_s": meridian["chat_c32"]["requests_per_s"],
        "stream_c32_streams_per_s": meridian.get("stream_c32", {}).get("requests_per_s"),
        "chat_c32_cpu_ms_per_request": meridian["chat_c32"]["proxy_cpu_ms_per_request"],
        "cpu_ms_per_relayed_chunk": (chunk_cpu or {}).get("meridian"),
        "rss_mb_after_all_requests": rss["rss_mb_after_second_half"] if rss else None,
        "rss_growth_mb_second_half": rss["rss_growth_mb_second_half"] if rss else None,
    }
    verdicts = {}
    for name, (op, bound) in GOALS.items():
        value = measured[name]
        met = None if value is None else (value <= bound if op == "<=" else value >= bound)
        verdicts[name] = {"target": f"{op} {bound:g}", "measured": value, "met": met}
    return verdicts


def added_latency(
    systems: dict[str, dict[str, Any]], proxy: str, baseline: str = "direct"
) -> dict[str, float | None]:
    """proxy - direct for each latency the benchmark reports, in ms (negative = within noise)."""
    added: dict[str, float | None] = {}
    for phase, metric, stat in ADDED_KEYS:
        key = f"{metric}_{stat}_ms"
        mine, base = systems[proxy].get(phase, {}).get(key), systems[baseline].get(phase, {}).get(key)
        added[f"{phase}_{key}"] = round(mine - base, 3) if mine is not None and base is not None else None
    return added


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 2)


def compare(systems: dict[str, dict[str, Any]], added: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    """Meridian against LiteLLM: the target ratios and whether they are met."""
    meridian_p50 = added["meridian"]["chat_c1_latency_p50_ms"]
    litellm_p50 = added["litellm"]["chat_c1_latency_p50_ms"]
    measured = _ratios(systems, added, "meridian")
    if meridian_p50 is not None and meridian_p50 <= 0 and litellm_p50 is not None and litellm_p50 > 0:
        measured["p50_added_latency_ratio"] = math.inf  # Meridian added nothing measurable
    targets = {
        name: {
            "target": target,
            "measured": None if measured[name] is None or math.isinf(measured[name]) else measured[name],
            "met": measured[name] is not None and measured[name] >= target,
        }
        for name, target in TARGETS.items()
    }
    informative = {
        "c32_p50_added_latency_ratio": _ratio(
            added["litellm"]["chat_c32_latency_p50_ms"], added["meridian"]["chat_c32_latency_p50_ms"]
        ),
        "stream_ttfb_p50_added_ratio": _ratio(
            added["litellm"]["stream_c1_ttfb_p50_ms"], added["meridian"]["stream_c1_ttfb_p50_ms"]
        ),
        "stream_c32_streams_per_s_ratio": _ratio(
            systems["meridian"].get("stream_c32", {}).get("requests_per_s"),
            systems["litellm"].get("stream_c32", {}).get("requests_per_s"),
        ),
    }
    # What a gateway with no work of its own between the server and the upstream would reach: the
    # ceiling of these ratios on this stack (gateway_bench.floor, with --floor).
    ceilings = {name: _ratios(systems, added, name) for name in systems if name.startswith("floor_")}
    return {"targets": targets, "other_ratios": informative, "ceilings": ceilings}


def _ratios(
    systems: dict[str, dict[str, Any]], added: dict[str, dict[str, float | None]], proxy: str
) -> dict[str, float | None]:
    """TARGETS' ratios for `proxy` against LiteLLM."""
    return {
        "p50_added_latency_ratio": _ratio(
            added["litellm"]["chat_c1_latency_p50_ms"], added[proxy]["chat_c1_latency_p50_ms"]
        ),
        "proxy_cpu_per_request_ratio": _ratio(
            systems["litellm"]["chat_c32"]["proxy_cpu_ms_per_request"],
            systems[proxy]["chat_c32"]["proxy_cpu_ms_per_request"],
        ),
        "requests_per_s_ratio": _ratio(
            systems[proxy]["chat_c32"]["requests_per_s"], systems["litellm"]["chat_c32"]["requests_per_s"]
        ),
    }


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(
    systems: dict[str, dict[str, Any]],
    added: dict[str, dict[str, float | None]],
    comparison: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """The short printed summary; the JSON has everything. `extra`: the document's `scaling`,
    `rss` and `goals`, each printed when present."""
    header = (
        f"{'system':<14}{'c1 p50':>8}{'c1 p99':>8}{'c32 p50':>9}{'c32 p99':>9}{'c32 req/s':>11}"
        f"{'ttfb p50':>10}{'ttfb p99':>10}{'strm/s c32':>12}{'cpu ms/req':>12}{'errors':>8}"
    )
    lines = [
        "latency in ms (non-streamed chat; ttfb = streamed, first data event, c=1; "
        "strm/s = streams of 16 chunks/s at c=32; cpu = the system's own, per c32 request)",
        header,
    ]
    for name, phases in systems.items():
        c1, c32 = phases.get("chat_c1", {}), phases.get("chat_c32", {})
        stream, streams = phases.get("stream_c1", {}), phases.get("stream_c32", {})
        errors = sum(phases[p]["errors"] for p in phases)
        lines.append(
            f"{name:<14}{_cell(c1.get('latency_p50_ms')):>8}{_cell(c1.get('latency_p99_ms')):>8}"
            f"{_cell(c32.get('latency_p50_ms')):>9}{_cell(c32.get('latency_p99_ms')):>9}"
            f"{_cell(c32.get('requests_per_s'), 0):>11}"
            f"{_cell(stream.get('ttfb_p50_ms')):>10}{_cell(stream.get('ttfb_p99_ms')):>10}"
            f"{_cell(streams.get('requests_per_s'), 0):>12}"
            f"{_cell(c32.get('proxy_cpu_ms_per_request'), 3):>12}{errors:>8}"
        )
    for name, deltas in added.items():
        lines.append(
            f"{'+' + name:<14}{_cell(deltas['chat_c1_latency_p50_ms']):>8}{_cell(deltas['chat_c1_latency_p99_ms']):>8}"
            f"{_cell(deltas['chat_c32_latency_p50_ms']):>9}{_cell(deltas['chat_c32_latency_p99_ms']):>9}{'':>11}"
            f"{_cell(deltas['stream_c1_ttfb_p50_ms']):>10}{_cell(deltas['stream_c1_ttfb_p99_ms']):>10}"
        )
    if comparison is not None:
        for name, target in comparison["targets"].items():
            verdict = "met" if target["met"] else "MISSED"
            shown = "inf" if target["measured"] is None and target["met"] else _cell(target["measured"])
            lines.append(f"target {name}: {shown} (want >= {target['target']:g}) {verdict}")
        for name, ratios in comparison.get("ceilings", {}).items():
            shown = ", ".join(f"{k.removesuffix('_ratio')} {_cell(v)}" for k, v in ratios.items())
            lines.append(f"ceiling ({name}, no gateway work): {shown}")
    extra = extra or {}
    if extra.get("scaling"):
        workers = extra["scaling"]["workers"]
        for phase, numbers in extra["scaling"].items():
            if phase != "workers":
                lines.append(
                    f"scaling {phase}: 1 worker {_cell(numbers['requests_per_s_1_worker'], 0)}/s, "
                    f"{workers} workers {_cell(numbers[f'requests_per_s_{workers}_workers'], 0)}/s "
                    f"(x{_cell(numbers['speedup'])})"
                )
    if extra.get("rss"):
        rss = extra["rss"]
        lines.append(
            f"rss meridian: {rss['rss_mb_start']} MiB at start, {rss['rss_mb_after_first_half']} after "
            f"{rss['requests_per_half']} requests, {rss['rss_mb_after_second_half']} after "
            f"{2 * rss['requests_per_half']} "
            f"({rss['errors']} errors{', TRUNCATED' if rss['truncated'] else ''})"
        )
    if extra.get("cpu_ms_per_relayed_chunk"):
        shown = ", ".join(f"{k} {_cell(v, 4)}" for k, v in extra["cpu_ms_per_relayed_chunk"].items())
        lines.append(f"cpu ms per relayed chunk (long streams minus short, per extra chunk): {shown}")
    for name, goal in (extra.get("goals") or {}).items():
        verdict = {True: "met", False: "MISSED", None: "not measured"}[goal["met"]]
        lines.append(f"goal {name}: {_cell(goal['measured'])} (want {goal['target']}) {verdict}")
    return "\n".join(lines)

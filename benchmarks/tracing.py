"""What tracing costs the gateway per request: Meridian with tracing off and on, side by side.

    .venv/bin/python benchmarks/tracing.py [--quick] [--ratio 0.1] [--out PATH]

What it does, in order:
  1. Starts the fixed-response upstream (gateway_bench.upstream) and a local OTLP/HTTP receiver
     (gateway_bench.otlp_sink, a thread of this process that decodes and counts the spans).
  2. Starts two Meridian gateways from this checkout with the real CLI, configured alike
     (gateway_bench.systems.start_meridian): `meridian` with tracing off (OTEL_SDK_DISABLED=true,
     the default behaviour made explicit) and `meridian_traced` with tracing on, every request
     sampled (OTEL_TRACES_SAMPLER=always_on) and exported over OTLP/HTTP to the receiver by the
     SDK's batch span processor (its default schedule). With --ratio R (default 0.1; 0 skips it),
     a third, `meridian_sampled`, samples that fraction of requests (parentbased_traceidratio), as
     a production deployment would.
  3. Warms both up, then measures them in the gateway_overhead benchmark's phases (gateway_bench.
     runner: concurrency-1 phases interleave the systems, concurrency-32 phases run them back to
     back in a rotating order, in --rounds rounds): chat_c1, chat_c32, stream_c1, stream_c32.
  4. Reports, per phase, latency (p50, mean) and each gateway's own CPU per request, and the cost
     of tracing: traced - untraced. CPU per request is the steadier measure on a shared machine;
     latency differences within the rounds' spread are noise. The spans the receiver counted show
     that each traced request was exported (one server span per request).
  5. Writes benchmarks/results/tracing.json and prints a short table.

The receiver, the client, the upstream and both gateways share this machine's cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway_bench.otlp_sink import SpanCounts, otlp_sink
from gateway_bench.processes import stop_server
from gateway_bench.report import summarize
from gateway_bench.runner import Phase, measure, warm_up
from gateway_bench.systems import REPO, System, start_meridian, start_upstream

DEFAULT_OUT = REPO / "benchmarks" / "results" / "tracing.json"
FULL = {
    "requests_c1": 600,
    "requests_c32": 4000,
    "streams": 400,
    "streams_c32": 1600,
    "rounds": 4,
    "warmup": 300,
}
QUICK = {"requests_c1": 60, "requests_c32": 400, "streams": 40, "streams_c32": 160, "rounds": 1, "warmup": 64}
TRACED = "meridian_traced"
SAMPLED = "meridian_sampled"
UNTRACED = "meridian"


def phases(args: argparse.Namespace) -> list[Phase]:
    return [
        Phase("chat_c1", stream=False, concurrency=1, requests=args.requests_c1, warmup=10),
        Phase("chat_c32", stream=False, concurrency=32, requests=args.requests_c32, warmup=64),
        Phase("stream_c1", stream=True, concurrency=1, requests=args.streams, warmup=10),
        Phase("stream_c32", stream=True, concurrency=32, requests=args.streams_c32, warmup=32),
    ]


@contextlib.contextmanager
def running_systems(work: Path, receiver_url: str, ratio: float) -> Iterator[list[System]]:
    started: list[System] = []
    try:
        upstream = start_upstream(work, chunks=16)
        started.append(upstream)
        started.append(
            start_meridian(work, upstream.base_url, name=UNTRACED, env={"OTEL_SDK_DISABLED": "true"})
        )
        traced_env = {
            "OTEL_SDK_DISABLED": "false",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver_url,
            "OTEL_SERVICE_NAME": "meridian-gateway-bench",
            "OTEL_TRACES_SAMPLER": "always_on",
        }
        started.append(start_meridian(work, upstream.base_url, name=TRACED, env=traced_env))
        if ratio > 0:
            sampled_env = {
                **traced_env,
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": str(ratio),
            }
            started.append(start_meridian(work, upstream.base_url, name=SAMPLED, env=sampled_env))
        yield started
    finally:
        for system in reversed(started):
            for server in system.servers:
                stop_server(server)


def cost(systems: dict[str, dict[str, Any]], traced_name: str) -> dict[str, dict[str, float | None]]:
    """traced - untraced, per phase: latency (ms) and the gateway's CPU per request (ms)."""
    out: dict[str, dict[str, float | None]] = {}
    for phase, untraced in systems[UNTRACED].items():
        traced = systems[traced_name][phase]
        keys = ["latency_p50_ms", "latency_mean_ms", "proxy_cpu_ms_per_request"]
        if "ttfb_p50_ms" in untraced:
            keys.append("ttfb_p50_ms")
        out[phase] = {
            key: round(traced[key] - untraced[key], 4)
            if traced.get(key) is not None and untraced.get(key) is not None
            else None
            for key in keys
        }
        base = untraced.get("proxy_cpu_ms_per_request")
        extra = out[phase]["proxy_cpu_ms_per_request"]
        out[phase]["cpu_increase_pct"] = round(100 * extra / base, 1) if base and extra is not None else None
    return out


def table(
    systems: dict[str, dict[str, Any]], costs: dict[str, dict[str, float | None]], spans: dict[str, int]
) -> str:
    def cell(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        "ms; cpu = the gateway's own CPU per request; cost = traced - untraced",
        f"{'phase':<12}{'system':<17}{'p50':>9}{'mean':>9}{'ttfb p50':>10}{'cpu/req':>10}{'req/s':>9}",
    ]
    for phase in systems[UNTRACED]:
        for name in systems:
            row = systems[name][phase]
            lines.append(
                f"{phase:<12}{name:<17}{cell(row.get('latency_p50_ms')):>9}{cell(row.get('latency_mean_ms')):>9}"
                f"{cell(row.get('ttfb_p50_ms')):>10}{cell(row.get('proxy_cpu_ms_per_request')):>10}"
                f"{cell(row.get('requests_per_s'), 0):>9}"
            )
        for name, per_phase in costs.items():
            c = per_phase[phase]
            lines.append(
                f"{phase:<12}{'cost ' + name.removeprefix('meridian_'):<17}{cell(c['latency_p50_ms']):>9}"
                f"{cell(c['latency_mean_ms']):>9}{cell(c.get('ttfb_p50_ms')):>10}"
                f"{cell(c['proxy_cpu_ms_per_request']):>10}{'(+' + cell(c['cpu_increase_pct'], 1) + '%)':>9}"
            )
    lines.append(
        f"receiver: {spans['server_spans']} server spans ({spans['spans']} spans, {spans['exports']} exports, "
        f"{spans['bytes'] / 1024:.0f} KiB)"
    )
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    plan = phases(args)
    conditions: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "rounds": args.rounds,
        "phases": [vars(p) for p in plan],
        "warmup_requests_per_system": args.warmup,
        "traced": "OTEL_TRACES_SAMPLER=always_on, OTLP/HTTP protobuf to a local receiver thread, "
        "BatchSpanProcessor defaults",
        "sampled_ratio": args.ratio,
    }
    started = time.monotonic()
    counts: SpanCounts
    with (
        tempfile.TemporaryDirectory(prefix="meridian-tracing-bench-") as folder,
        otlp_sink() as (url, counts),
    ):
        with running_systems(Path(folder), url, args.ratio) as systems:
            print(f"systems up: {', '.join(f'{s.name} {s.base_url}' for s in systems)}", flush=True)
            gateways = [s for s in systems if not s.is_upstream]
            warm_up(gateways, args.warmup, args.deadline_s)
            runs = measure(gateways, plan, rounds=args.rounds, deadline_s=args.deadline_s)
        spans = counts.snapshot()  # the traced gateway flushed its spans as it stopped
    conditions["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    conditions["duration_s"] = round(time.monotonic() - started, 1)
    summaries = summarize(runs, plan)
    costs = {name: cost(summaries, name) for name in (TRACED, SAMPLED) if name in summaries}
    return {"conditions": conditions, "systems": summaries, "tracing_cost": costs, "receiver": spans}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, one round (a rough look)")
    for name in FULL:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int)
    parser.add_argument(
        "--ratio", type=float, default=0.1, help="also measure a gateway sampling this fraction (0: skip)"
    )
    parser.add_argument("--deadline-s", type=float, default=180.0, help="time bound of one measurement")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_benchmark(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result["systems"], result["tracing_cost"], result["receiver"]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

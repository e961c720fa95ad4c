"""What Meridian's gateway adds on top of an upstream: latency, requests/s, streaming first byte.

    .venv/bin/python benchmarks/gateway_overhead.py [--compare-litellm] [--quick] [--workers 2]
                                                    [--rss-requests 100000]

What it does, in order:
  1. Starts the fixed-response upstream (gateway_bench.upstream) in its own process: a raw ASGI
     app under uvicorn (uvloop, httptools) answering /v1/chat/completions instantly with a canned
     completion, or with `stream: true` a canned SSE stream (role chunk, 16 content chunks, finish
     chunk, usage chunk when asked, [DONE]) with no delay; it also serves /ready, /health, /load
     and /v1/models so that Meridian's prober sees a healthy idle node.
  2. Starts Meridian's gateway with the real CLI (`python -m meridian.cli gateway --config FILE`)
     in its own process: a static directory holding that one node, one catalog model, one tenant
     with no limits, the in-process quota store, node credential from MERIDIAN_NODE_TOKEN, and
     every other setting at its default (access log off, INFO start-up lines only).
  3. With --compare-litellm, starts LiteLLM's proxy in front of the same upstream (one process,
     no database, callbacks/telemetry/spend logs off, httptools installed alongside it), at the
     release the goals are stated against (1.106.2; --litellm-version names another); it is
     pip-installed into /tmp/meridian-litellm-VERSION-venv first if that venv has no `litellm`.
     gateway_bench/litellm_proxy.py says exactly how it is configured.
  4. With --compare-tree PATH, also starts Meridian from the checkout at PATH as `meridian_base`,
     measured in every phase like `meridian`: a before/after comparison in the same conditions
     (e.g. PATH = `git archive BASE_COMMIT | tar -x -C PATH`).
     With --workers N (N > 1), also starts a second Meridian with `--workers N` (N processes on
     one port), measured in the concurrency-32 phases only: the table's `scaling` lines set its
     throughput against the one-worker gateway's.
     With --without-ledger, also starts the same gateway with its usage ledger off
     (`ledger: {enabled: false}`) as `meridian_no_ledger`: what recording every request's usage
     (the event, the in-process outbox, the SQLite writes) costs, measured beside it.
  5. Warms every system up (unrecorded requests, streamed and not), then measures four phases
     in `--rounds` rounds:
       chat_c1    non-streamed chat, concurrency 1          latency p50/p99
       chat_c32   non-streamed chat, concurrency 32         latency p50/p99, requests/s
       stream_c1  streamed chat, concurrency 1              time to first data event p50/p99
       stream_c32 streamed chat, concurrency 32             streams/s (of --chunks content chunks)
     The concurrency-1 phases interleave the systems in one client process: turns of 20
     back-to-back requests per system (plus one unrecorded request to wake the system after its
     idle spell), the first system rotating every turn; chat_c32 runs the systems back to back
     in an order that rotates every round. "direct" is the upstream itself; added latency =
     system - direct. Each measurement is a separate load-generator process (gateway_bench.load:
     one keep-alive HTTP/1.1 connection per concurrent worker, fixed request counts, bounded by
     --deadline-s) that reports its own CPU use; every reply is checked (200 and choices, or a
     stream ending in [DONE]). Each system's CPU time is read from /proc around every
     measurement (for "direct", the upstream, which also serves the proxies' requests).
  6. The independent overhead method (gateway_bench.sequential), as public gateway comparisons
     measure it: --sequential-requests sequential non-streamed requests per system per round on
     one keep-alive httpx connection, in --sequential-rounds rounds with the order rotating; the
     median of each round's block, the median of those, minus direct's (0 skips it).
  7. Then the RSS phase, on the one-worker Meridian only: --rss-requests non-streamed requests
     at concurrency 32 in two halves, with the gateway's VmRSS (/proc/PID/status) read before,
     between and after them (0 skips it). Growth in the second half would be a leak.
  8. Writes benchmarks/results/gateway_overhead.json (conditions, per-system summaries, added
     latency, scaling, RSS, the issue's absolute goals for Meridian, and with LiteLLM the target
     ratios) and prints a table. Targets against LiteLLM (issue 31): its p50 added latency
     (chat_c1) at least 30x Meridian's, its CPU per chat_c32 request at least 40x Meridian's,
     and Meridian's chat_c32 requests/s at least 40x LiteLLM's. With --floor, the same ratios
     for the server and framework alone (gateway_bench.floor): the most any gateway on this stack
     could reach.

The client, the systems and the upstream share this machine's cores (and on the team machine,
other engineers' work), so absolute numbers are noisy; the JSON records CPU count and load average
before and after, and the per-round numbers show the spread.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway_bench.litellm_proxy import LITELLM_VERSION, default_venv, litellm_version, start_litellm
from gateway_bench.processes import stop_server
from gateway_bench.report import added_latency, compare, goals, per_chunk, scaling, summarize, table
from gateway_bench.runner import Phase, measure, measure_rss, warm_up
from gateway_bench.sequential import measure_sequential, sequential_lines
from gateway_bench.systems import REPO, System, start_floor, start_meridian, start_upstream

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gateway_overhead.json"
FULL = {
    "requests_c1": 300,
    "requests_c32": 3000,
    "streams": 300,
    "streams_c32": 1500,
    "rss_requests": 100_000,
    "rounds": 3,
    "warmup": 200,
    "sequential_requests": 200,
    "sequential_rounds": 5,
}
QUICK = {
    "requests_c1": 60,
    "requests_c32": 600,
    "streams": 60,
    "streams_c32": 300,
    "rss_requests": 0,
    "rounds": 1,
    "warmup": 64,
    "sequential_requests": 50,
    "sequential_rounds": 2,
}
# How many times longer the long streams are (stream_c32_long).
LONG_STREAM = 4
# The phases a `--workers N` gateway is measured in: scaling is about throughput.
SCALING_PHASES = frozenset({"chat_c32", "stream_c32"})


def phases(args: argparse.Namespace) -> list[Phase]:
    return [
        Phase("chat_c1", stream=False, concurrency=1, requests=args.requests_c1, warmup=10),
        Phase("chat_c32", stream=False, concurrency=32, requests=args.requests_c32, warmup=64),
        Phase(
            "stream_c1", stream=True, concurrency=1, requests=args.streams, warmup=10, max_tokens=args.chunks
        ),
        Phase(
            "stream_c32",
            stream=True,
            concurrency=32,
            requests=args.streams_c32,
            warmup=32,
            max_tokens=args.chunks,
        ),
        # The same streams, LONG_STREAM times as long: the CPU a relayed chunk costs is the
        # difference per stream over the extra chunks (report.per_chunk), whatever a stream's
        # own opening and settling cost.
        Phase(
            "stream_c32_long",
            stream=True,
            concurrency=32,
            requests=max(args.streams_c32 // LONG_STREAM, 32),
            warmup=32,
            max_tokens=LONG_STREAM * args.chunks,
        ),
    ]


def _versions(litellm_venv: Path | None) -> dict[str, str]:
    versions = {}
    for package in ("litestar", "uvicorn", "uvloop", "httptools", "httpx", "msgspec"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    if litellm_venv is not None:
        versions["litellm"] = litellm_version(litellm_venv)
    return versions


def source_digest(tree: Path = REPO) -> str:
    """SHA-256 over the gateway's Python sources: the tree is shared and changes between runs, so
    a result names the code it measured."""
    digest = hashlib.sha256()
    for package in ("gateway", "router", "protocol"):
        for path in sorted((tree / package).rglob("*.py")):
            digest.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def running_systems(work: Path, args: argparse.Namespace) -> Iterator[list[System]]:
    """direct, meridian and (asked for) litellm, all stopped on the way out however it ends."""
    started: list[System] = []
    try:
        upstream = start_upstream(work, chunks=args.chunks)
        started.append(upstream)
        started.append(start_meridian(work, upstream.base_url))
        if args.compare_tree is not None:
            started.append(start_meridian(work, upstream.base_url, tree=args.compare_tree))
        if args.workers > 1:
            started.append(
                start_meridian(work, upstream.base_url, workers=args.workers, only_phases=SCALING_PHASES)
            )
        for server in args.servers:
            started.append(start_meridian(work, upstream.base_url, server=server))
        if args.without_ledger:
            off = {"ledger": {"enabled": False}}
            started.append(
                start_meridian(work, upstream.base_url, name="meridian_no_ledger", extra_config=off)
            )
        if args.floor:
            started += [start_floor(work, upstream.base_url, kind) for kind in ("litestar", "asgi")]
        if args.compare_litellm:
            started.append(start_litellm(work, upstream.base_url, args.litellm_venv, args.litellm_version))
        yield started
    finally:
        for system in reversed(started):
            for server in system.servers:
                stop_server(server)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Start the systems, measure them, and return the JSON document (nothing is written)."""
    plan = phases(args)
    conditions: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "meridian_source_sha256": source_digest(),
        "meridian_base_tree": str(args.compare_tree) if args.compare_tree else None,
        "meridian_base_source_sha256": source_digest(args.compare_tree) if args.compare_tree else None,
        "rounds": args.rounds,
        "phases": [vars(p) | {"requests_per_round": p.requests / args.rounds} for p in plan],
        "warmup_requests_per_system": args.warmup,
        "stream_content_chunks": args.chunks,
        "deadline_s_per_measurement": args.deadline_s,
        "workers": args.workers,
        "rss_requests": args.rss_requests,
        "rss_deadline_s_per_half": args.rss_deadline_s,
        "layout": {
            "processes": "client, upstream and each proxy are separate processes on 127.0.0.1; "
            "one process per proxy (meridian_wN: N worker processes on one port)",
            "client": "raw asyncio HTTP/1.1 keep-alive client on uvloop, one connection per worker",
            "c1_phases": "systems interleaved in turns of 20 requests, +1 unrecorded wake-up each",
            "c32_phase": "systems back to back, order rotating every round",
        },
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="meridian-gateway-bench-") as folder:
        work = Path(folder)
        with running_systems(work, args) as systems:
            print(f"systems up: {', '.join(f'{s.name} {s.base_url}' for s in systems)}", flush=True)
            # Added latency is measured at concurrency 1: for the systems that take part in it.
            proxies = [s.name for s in systems if not s.is_upstream and s.only_phases is None]
            warm_up(systems, args.warmup, args.deadline_s)
            runs = measure(systems, plan, rounds=args.rounds, deadline_s=args.deadline_s)
            sequential = None
            if args.sequential_requests > 0:
                sequential = measure_sequential(
                    systems, rounds=args.sequential_rounds, requests=args.sequential_requests
                )
            rss = None
            if args.rss_requests > 0:
                print(f"  rss: {args.rss_requests} requests through meridian ...", flush=True)
                meridian = next(s for s in systems if s.name == "meridian")
                rss = measure_rss(meridian, args.rss_requests, args.rss_deadline_s)
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*.log"):
                shutil.copy(log, args.keep_logs / log.name)
    conditions["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    # After the run: the LiteLLM venv may only exist now.
    conditions["versions"] = _versions(args.litellm_venv if args.compare_litellm else None)
    conditions["duration_s"] = round(time.monotonic() - started, 1)
    summaries = summarize(runs, plan)
    added = {name: added_latency(summaries, name) for name in proxies}
    comparison = compare(summaries, added) if "litellm" in summaries else None
    chunk_cpu = per_chunk(summaries, (LONG_STREAM - 1) * args.chunks)
    return {
        "conditions": conditions,
        "systems": summaries,
        "added_latency_ms": added,
        "scaling": scaling(summaries, args.workers) if args.workers > 1 else None,
        "rss": rss,
        "cpu_ms_per_relayed_chunk": chunk_cpu,
        "goals": goals(summaries, added, rss, chunk_cpu),
        "comparison": comparison,
        "sequential_overhead": sequential,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-litellm", action="store_true", help="also measure LiteLLM's proxy")
    parser.add_argument("--quick", action="store_true", help="fewer requests, one round (a rough look)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--requests-c1", type=int, help="non-streamed requests at concurrency 1, per system")
    parser.add_argument(
        "--requests-c32", type=int, help="non-streamed requests at concurrency 32, per system"
    )
    parser.add_argument("--streams", type=int, help="streamed requests at concurrency 1, per system")
    parser.add_argument("--streams-c32", type=int, help="streamed requests at concurrency 32, per system")
    parser.add_argument(
        "--rss-requests",
        type=int,
        help="requests of the RSS phase, in two halves (0: skip it; default 100000, --quick 0)",
    )
    parser.add_argument(
        "--rss-deadline-s", type=float, default=600.0, help="time bound of each half of the RSS phase"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="also measure `meridian gateway --workers N` (N > 1)"
    )
    parser.add_argument("--warmup", type=int, help="unrecorded requests per system before measuring")
    parser.add_argument(
        "--sequential-requests",
        type=int,
        help="the independent method: sequential requests per system per round (0 skips it; "
        "default 200, --quick 50)",
    )
    parser.add_argument(
        "--sequential-rounds", type=int, help="the independent method's rounds (default 5, --quick 2)"
    )
    parser.add_argument("--chunks", type=int, default=16, help="content chunks per upstream stream")
    parser.add_argument("--deadline-s", type=float, default=180.0, help="time bound of one measurement")
    parser.add_argument(
        "--litellm-version",
        default=LITELLM_VERSION,
        help=f"the LiteLLM release to compare with (default {LITELLM_VERSION}, the goals' peer)",
    )
    parser.add_argument(
        "--litellm-venv",
        type=Path,
        help="where LiteLLM is installed (default /tmp/meridian-litellm-VERSION-venv)",
    )
    parser.add_argument(
        "--compare-tree", type=Path, help="also measure Meridian from this checkout, as meridian_base"
    )
    parser.add_argument(
        "--servers",
        type=lambda value: [s for s in value.split(",") if s],
        default=[],
        help="also measure the gateway app under these ASGI servers (granian,hypercorn): "
        "meridian_granian, meridian_hypercorn",
    )
    parser.add_argument(
        "--without-ledger",
        action="store_true",
        help="also measure the gateway with its usage ledger off (meridian_no_ledger): what "
        "recording every request's usage costs",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure the server and framework alone around one upstream exchange "
        "(floor_litestar, floor_asgi): the least any gateway on this stack costs",
    )
    parser.add_argument("--keep-logs", type=Path, help="copy the servers' logs to this folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.litellm_venv is None:
        args.litellm_venv = default_venv(args.litellm_version)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_benchmark(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result["systems"], result["added_latency_ms"], result["comparison"], result))
    if result["sequential_overhead"] is not None:
        print("\n".join(sequential_lines(result["sequential_overhead"])))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

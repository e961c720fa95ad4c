"""Where Meridian's gateway spends its CPU per request: py-spy samples under the benchmark's load.

    pip install py-spy     (or the `bench` extra: pip install -e '.[bench]')
    .venv/bin/python benchmarks/gateway_profile.py [--requests 20000] [--streams 4000] [--top 25]

Starts the benchmark's fixed-response upstream and Meridian (gateway_bench.systems, exactly as
gateway_overhead.py does), warms them up, then for each load — non-streamed chat and 16-chunk
streams, both at concurrency 32 — samples the gateway process with `py-spy record` while one
load-generator process sends a fixed number of requests. py-spy pauses the process for each
sample (the CPU ms per request then include that cost): without pausing (`--nonblocking`) about
half the stacks come back cut short, which spoils the inclusive view. Idle samples (the event loop
waiting in epoll) are not recorded, so shares are of the gateway's busy CPU time.

For each load it prints and writes (benchmarks/results/gateway_profile.json, plus the raw
collapsed stacks next to it, which speedscope or flamegraph.pl read):
  - CPU ms per request (from /proc around the load, the same measure as gateway_overhead.py);
  - self time by area (our packages by folder, then each library): which layer costs what;
  - the top functions by self time and by inclusive time, with their share and ms per request.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gateway_bench.processes import stop_server
from gateway_bench.runner import Phase, run_client, spec_for, warm_up
from gateway_bench.systems import REPO, System, start_meridian, start_upstream

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gateway_profile.json"


# Leaves py-spy reports as busy although the thread only waits: the default executor's worker
# threads blocked on their work queue (Litestar runs sync callables there).
_IDLE_LEAVES = ("_worker (",)


def _area(frame: str) -> str:
    """The package area a frame belongs to: our folders (gateway/request, protocol, ...) or the
    library's top-level name (litestar, uvicorn, asyncio, ...)."""
    _, _, where = frame.rpartition(" (")
    path = where.rsplit(":", 1)[0]
    for ours in ("gateway/", "router/", "protocol/", "meridian/"):
        if path.startswith(ours) or f"/{ours}" in path:
            tail = path[path.index(ours) :]
            parts = tail.split("/")
            return "/".join(parts[:2]) if len(parts) > 2 else parts[0]
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/lib/python3" in path:
        return "stdlib:" + path.split("/lib/python3", 1)[1].split("/", 2)[1].removesuffix(".py")
    return path or frame


def _function(frame: str) -> str:
    """`name (file.py:line)` -> `name (file.py)`: one entry per function, not per line."""
    name, _, where = frame.rpartition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if name else frame


def summarize(collapsed: str, cpu_ms_per_request: float, top: int) -> dict[str, Any]:
    selfs: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        leaf = frames[-1]  # the root is first
        if _function(leaf).startswith(_IDLE_LEAVES):
            continue
        total += count
        selfs[_function(leaf)] += count
        areas[_area(leaf)] += count
        for function in {_function(f) for f in frames if " (" in f}:
            inclusive[function] += count

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "share": round(count / total, 4),
                "ms_per_request": round(count / total * cpu_ms_per_request, 4),
            }
            for name, count in counter.most_common(top)
        ]

    return {
        "samples": total,
        "cpu_ms_per_request": round(cpu_ms_per_request, 4),
        "self_by_area": rows(areas),
        "self_by_function": rows(selfs),
        "inclusive_by_function": rows(inclusive),
    }


def profile_load(
    system: System,
    phase: Phase,
    py_spy: str,
    rate: int,
    raw_path: Path,
    deadline_s: float,
    *,
    nonblocking: bool,
) -> float:
    """Run one load under py-spy; returns the gateway's CPU ms per request over it."""
    pid = system.servers[0].process.pid
    command = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate)]
    recorder = subprocess.Popen(
        [*command, *(["--nonblocking"] if nonblocking else []), "--output", str(raw_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # py-spy attaches
    cpu = system.cpu_s()
    result = run_client([spec_for(system, phase, phase.requests, deadline_s)])[0]
    cpu = system.cpu_s() - cpu
    recorder.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
    _, stderr = recorder.communicate(timeout=60)
    if not raw_path.exists():
        raise RuntimeError(f"py-spy wrote nothing: {stderr.decode()[-2000:]}")
    if result.errors > result.sent // 100:  # a few, from py-spy's pauses, do not spoil the profile
        raise RuntimeError(f"{phase.name}: {result.errors} errors, e.g. {result.error_samples[:2]}")
    return cpu / result.sent * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="non-streamed requests sampled")
    parser.add_argument("--streams", type=int, default=4_000, help="streams sampled")
    parser.add_argument("--chunks", type=int, default=16, help="content chunks per stream")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    parser.add_argument(
        "--nonblocking",
        action="store_true",
        help="sample without pausing the gateway: less overhead, but many stacks come back cut short",
    )
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--tree", type=Path, help="profile Meridian from this checkout instead")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy is not installed: pip install py-spy (or the `bench` extra)", file=sys.stderr)
        return 2
    loads = [
        Phase("chat_c32", stream=False, concurrency=32, requests=args.requests, warmup=64),
        Phase("stream_c32", stream=True, concurrency=32, requests=args.streams, warmup=32),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"py_spy_rate_hz": args.rate, "nonblocking": args.nonblocking, "loads": {}}
    with tempfile.TemporaryDirectory(prefix="meridian-gateway-profile-") as folder:
        work = Path(folder)
        systems: list[System] = []
        try:
            systems.append(start_upstream(work, chunks=args.chunks))
            # py-spy pauses the gateway for every sample: with the default 0.5 s probe timeout a
            # busy machine then made the upstream look unhealthy (503s) mid-profile, and the
            # paused streams' latencies made admission shed (429s). Both are off the request's
            # CPU path (the prober runs on its own timer; admission's estimate is still computed).
            extra = {
                "timeouts": {"probe_s": 10.0, "connect_s": 10.0},
                "admission": {
                    "interactive": {"target_ttft_s": 30.0, "queue_deadline_s": 10.0, "max_queue": 256}
                },
            }
            systems.append(start_meridian(work, systems[0].base_url, tree=args.tree, extra_config=extra))
            warm_up(systems[1:], 500, args.deadline_s)
            for phase in loads:
                raw = args.out.with_name(f"{args.out.stem}_{phase.name}.collapsed.txt")
                print(f"profiling {phase.name}: {phase.requests} requests ...", flush=True)
                cpu_ms = profile_load(
                    systems[1], phase, py_spy, args.rate, raw, args.deadline_s, nonblocking=args.nonblocking
                )
                report["loads"][phase.name] = summarize(raw.read_text(), cpu_ms, args.top) | {
                    "collapsed_stacks": str(raw)
                }
        finally:
            for system in reversed(systems):
                for server in system.servers:
                    stop_server(server)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, load in report["loads"].items():
        print(f"\n== {name}: {load['cpu_ms_per_request']:.3f} CPU ms per request, {load['samples']} samples")
        for title in ("self_by_area", "self_by_function", "inclusive_by_function"):
            print(f"-- {title.replace('_', ' ')}")
            for row in load[title]:
                print(f"  {row['share'] * 100:5.1f}%  {row['ms_per_request']:.4f} ms  {row['name']}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

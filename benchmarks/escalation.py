"""What the confidence cascade costs a client in time to first token.

    .venv/bin/python benchmarks/escalation.py [--requests 30] [--k 8] [--out PATH]

What it does, in order:
  1. Writes two random checkpoints (`mini` as the small tier, `small` as the large one: sizes
     whose decode steps take milliseconds on a CPU, as real tiers differ by their step time) and
     starts one regional node serving both, and one gateway (the real CLIs), in this process's
     temporary directory.
  2. Three tenants: `plain` (no `auto`), `keeper` (escalation threshold -1000: the small model
     always keeps the request, so its first K tokens are held and then released) and `doubter`
     (threshold 0: every request escalates after K tokens).
  3. Sends --requests streamed chat requests (32 output tokens, greedy) per mode, one at a time,
     the modes taking turns request by request so that a slow spell of the machine hits them
     alike:
       small           model meridian-small (no cascade)
       auto_kept       model auto, kept by the small model after the K-token hold-back
       auto_escalated  model auto, escalated: K small tokens, then the large model from the start
       large           model meridian-large (no cascade)
  4. Time to first token is from sending the request to the first chunk carrying content. The
     hold-back's cost is auto_kept - small; an escalation's is auto_escalated - large.
  5. Writes benchmarks/results/escalation.json and prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from gateway_bench.processes import free_port, start_server, stop_server, wait_until
from gateway_bench.report import percentile
from gateway_bench.systems import NODE_TOKEN, REPO, python_env

from gateway.policy import hash_api_key
from regional_node.checkpoints import init_checkpoint

SMALL, LARGE = "meridian-small", "meridian-large"
MODES = {
    "small": ("plain", SMALL),
    "auto_kept": ("keeper", "auto"),
    "auto_escalated": ("doubter", "auto"),
    "large": ("plain", LARGE),
}
THRESHOLDS = {"plain": None, "keeper": -1000.0, "doubter": 0.0}
OUTPUT_TOKENS = 32


def key(tenant: str) -> str:
    return f"sk-bench-{tenant}"


def write_federation(work: Path, k: int) -> tuple[Path, Path, int, int]:
    small = init_checkpoint(work / "small", arch="llama", size="mini")
    large = init_checkpoint(work / "large", arch="llama", size="small")
    node_port, gateway_port = free_port(), free_port()
    node = {
        "node_id": "bench-node",
        "region": "eu-west",
        "jurisdiction": "eu",
        "port": node_port,
        "models": [{"name": SMALL, "path": str(small)}, {"name": LARGE, "path": str(large)}],
    }
    (work / "node.yaml").write_text(yaml.safe_dump(node))
    (work / "policies").mkdir()
    tenants = []
    for tenant, threshold in THRESHOLDS.items():
        entry: dict[str, Any] = {"id": tenant, "api_keys": [hash_api_key(key(tenant))], "models": "*"}
        if threshold is not None:
            entry["escalation"] = {"threshold": threshold}
        tenants.append(entry)
    (work / "policies" / "bench.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
    regions = {
        "nodes": [
            {
                "node_id": "bench-node",
                "url": f"http://127.0.0.1:{node_port}",
                "region": "eu-west",
                "jurisdiction": "eu",
                "models": [SMALL, LARGE],
            }
        ]
    }
    (work / "regions.yaml").write_text(yaml.safe_dump(regions))
    gateway = {
        "home_region": "eu-west",
        "catalog": [{"name": SMALL, "tier": "small"}, {"name": LARGE, "tier": "large"}],
        "policies": str(work / "policies"),
        "directory": {"type": "static", "file": str(work / "regions.yaml")},
        "listen": {"host": "127.0.0.1", "port": gateway_port},
        "admin": {"host": "127.0.0.1", "port": free_port()},  # /metrics
        "auto": {
            # A short prompt starts small whatever the history; the doubter never cools down.
            "classifier": {"weights": {"escalation_rate": 0.0}},
            "escalation": {"k_tokens": k, "window": min(4, k)},
            "thrash": {"min_requests": 1_000_000},
        },
        "ledger": {"enabled": False},
    }
    (work / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    return work / "node.yaml", work / "gateway.yaml", node_port, gateway_port


async def first_token_s(
    client: httpx.AsyncClient, url: str, tenant: str, model: str, i: int
) -> tuple[float, str]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me about the sea, part {i}"}],
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    started = time.perf_counter()
    ttft = None
    async with client.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key(tenant)}"}
    ) as response:
        response.raise_for_status()
        route = response.headers.get("x-meridian-route", "")
        async for line in response.aiter_lines():
            if ttft is None and line.startswith("data: {") and '"content":"' in line.replace(" ", ""):
                ttft = time.perf_counter() - started
    assert ttft is not None, "no content arrived"
    return ttft, route


async def measure(url: str, requests: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    async with httpx.AsyncClient(timeout=60) as client:
        for tenant, model in MODES.values():  # warm-up: one of each
            await first_token_s(client, url, tenant, model, -1)
        for i in range(requests):
            for mode, (tenant, model) in MODES.items():
                ttft, route = await first_token_s(client, url, tenant, model, i)
                if mode == "auto_kept":
                    assert route.startswith("auto:small;") and "confident=" in route, route
                if mode == "auto_escalated":
                    assert route.startswith("auto:small->large;"), route
                samples[mode].append(ttft)
    return samples


def summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        mode: {
            "p50_ms": round(percentile(values, 50) * 1000, 2),
            "p95_ms": round(percentile(values, 95) * 1000, 2),
            "mean_ms": round(statistics.fmean(values) * 1000, 2),
        }
        for mode, values in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="streamed requests per mode")
    parser.add_argument("--k", type=int, default=8, help="tokens held back and judged")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "escalation.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meridian-escalation-") as tmp:
        work = Path(tmp)
        node_config, gateway_config, node_port, gateway_port = write_federation(work, args.k)
        env = python_env(MERIDIAN_NODE_TOKEN=NODE_TOKEN, OMP_NUM_THREADS="1")
        node = start_server(
            "node",
            [
                sys.executable,
                "-m",
                "regional_node",
                "node",
                "--config",
                str(node_config),
                "--log-level",
                "warning",
            ],
            log_dir=work,
            env=env,
            cwd=REPO,
        )
        gateway = None
        try:
            auth = {"authorization": f"Bearer {NODE_TOKEN}"}
            wait_until(node, lambda: _ok(f"http://127.0.0.1:{node_port}/ready", auth), timeout_s=120)
            gateway = start_server(
                "gateway",
                [sys.executable, "-m", "meridian.cli", "gateway", "--config", str(gateway_config)],
                log_dir=work,
                env=env,
                cwd=REPO,
            )
            url = f"http://127.0.0.1:{gateway_port}"
            wait_until(gateway, lambda: _ok(f"{url}/ready", {}), timeout_s=60)
            samples = asyncio.run(measure(url, args.requests))
        finally:
            if gateway is not None:
                stop_server(gateway)
            stop_server(node)
    result = summary(samples)
    added = {
        "hold_back_p50_ms": round(result["auto_kept"]["p50_ms"] - result["small"]["p50_ms"], 2),
        "escalation_p50_ms": round(result["auto_escalated"]["p50_ms"] - result["large"]["p50_ms"], 2),
    }
    report = {
        "benchmark": "escalation",
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "k_tokens": args.k,
        "requests_per_mode": args.requests,
        "output_tokens": OUTPUT_TOKENS,
        "ttft": result,
        "added": added,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"time to first token, streamed, {args.requests} requests per mode, K = {args.k}")
    print(f"{'mode':<16}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}")
    for mode, row in result.items():
        print(f"{mode:<16}{row['p50_ms']:>10.1f}{row['p95_ms']:>10.1f}{row['mean_ms']:>10.1f}")
    print(
        f"hold-back adds {added['hold_back_p50_ms']:.1f} ms (p50, auto_kept - small); "
        f"an escalation adds {added['escalation_p50_ms']:.1f} ms (p50, auto_escalated - large)"
    )
    print(f"wrote {args.out}")
    return 0


def _ok(url: str, headers: dict[str, str]) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    sys.exit(main())

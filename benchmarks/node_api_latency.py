"""How quickly a node's own API answers while its engine is saturated, from a client on the same box.

    .venv/bin/python benchmarks/node_api_latency.py [--engines meridian,vllm] [--shares default,off]
        [--streams 4] [--seconds 20] [--out PATH]

What it does, for each engine (ours, and vLLM's when it is installed) and each CPU share:
  1. Writes the tiny test Llama (head_dim 32, which vLLM's CPU attention takes; 32768 positions)
     and starts one node on it (the real CLI, a free port), configured as tests/node_vllm does.
     `default` is the node's default share (regional_node/server/README.md, "CPU share": engine
     on every core but the last, 10 levels nicer); `off` is `cpu: null`, the engine unconfined
     (how nodes ran before the share existed).
  2. Saturates the engine: a separate load process keeps --streams streamed completions of 30000
     tokens (ignore_eos) running and reads them, starting a new one whenever one ends; the
     measurement waits until /load reports them all running.
  3. This process, the client on the same box, calls /health, /ready and /load in turn for
     --seconds (20 ms apart), timing each call from send to the last byte (time.perf_counter):
     what a co-located client sees, its own wait for a CPU included (though not a wait before it
     sends). Every answer must be 200; a call whose kept-alive connection the node closed while
     this process could not run is sent again and counted.
  4. Writes JSON (per run: p50/p99/max per endpoint, samples, the engine's tokens/s from /load's
     drain rate, the machine's load average) to --out and prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import subprocess
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

MODEL = "tiny"
ENDPOINTS = ("health", "ready", "load")
LONG = 30000  # tokens per stream: far more than a run generates
MAX_MODEL_LEN = 32768
BLOCK_SIZE = 32
AUTH = {"authorization": f"Bearer {NODE_TOKEN}"}


def write_node(work: Path, checkpoint: Path, engine: str, share: str) -> tuple[Path, int]:
    port = free_port()
    options: dict[str, Any] = {"max_model_len": MAX_MODEL_LEN}
    if engine == "vllm":
        options["enforce_eager"] = True  # no torch.compile warm-up: half a minute less start-up
    config: dict[str, Any] = {
        "node_id": f"bench-{engine}",
        "port": port,
        "engine": engine,
        "models": [
            {
                "name": MODEL,
                "path": str(checkpoint),
                "engine": {
                    "block_size": BLOCK_SIZE,
                    "num_kv_blocks": MAX_MODEL_LEN // BLOCK_SIZE + 8,
                    "max_num_seqs": 8,
                    "options": options,
                },
            }
        ],
    }
    if share == "off":
        config["cpu"] = None
    path = work / f"{engine}-{share}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, port


def load_streams(url: str, streams: int) -> None:
    """The load process: `streams` long streams, each replaced when it ends, until killed."""

    async def stream(client: httpx.AsyncClient, index: int) -> None:
        for round_ in range(1_000_000):
            body = {
                "model": MODEL,
                "prompt": f"{index}.{round_} Far across the sea",
                "max_tokens": LONG,
                "stream": True,
                "ignore_eos": True,
            }
            async with client.stream("POST", "/v1/completions", json=body) as response:
                response.raise_for_status()
                async for _ in response.aiter_lines():
                    pass

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=600) as client:
            await asyncio.gather(*(stream(client, i) for i in range(streams)))

    asyncio.run(run())


def _running(url: str) -> int:
    try:
        return int(httpx.get(f"{url}/load", headers=AUTH, timeout=60).json()["num_running"])
    except (httpx.HTTPError, KeyError, ValueError):
        return 0


def probe(url: str, seconds: float) -> tuple[dict[str, list[float]], list[float], int]:
    """Latency samples per endpoint (s), the engine's drain rate from each /load, and how many
    calls found their kept-alive connection closed (the client itself was held off a CPU for
    longer than the node's keep_alive_s) and were sent again, the retry counted in their time."""
    samples: dict[str, list[float]] = {endpoint: [] for endpoint in ENDPOINTS}
    rates: list[float] = []
    resent = 0
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for endpoint in ENDPOINTS:
                started = time.perf_counter()
                try:
                    response = client.get(f"/{endpoint}")
                except httpx.RemoteProtocolError:
                    resent += 1
                    response = client.get(f"/{endpoint}")
                samples[endpoint].append(time.perf_counter() - started)
                assert response.status_code == 200, (endpoint, response.status_code, response.text)
                if endpoint == "load":
                    rates.append(float(response.json()["per_model"][MODEL]["drain_tokens_per_s"]))
            time.sleep(0.02)
    return samples, rates, resent


def run_one(work: Path, checkpoint: Path, engine: str, share: str, streams: int, seconds: float) -> dict:
    config, port = write_node(work, checkpoint, engine, share)
    url = f"http://127.0.0.1:{port}"
    env = python_env(MERIDIAN_NODE_TOKEN=NODE_TOKEN, OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "regional_node",
        "node",
        "--config",
        str(config),
        "--log-level",
        "warning",
    ]
    node = start_server(f"node-{engine}-{share}", command, log_dir=work, env=env, cwd=REPO)
    loader = None
    try:
        wait_until(node, lambda: _ok(f"{url}/ready"), timeout_s=300)
        loader = subprocess.Popen(
            [sys.executable, __file__, "--load", url, "--streams", str(streams)],
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
        wait_until(node, lambda: _running(url) >= streams, timeout_s=180)
        load_before = os.getloadavg()[0]
        samples, rates, resent = probe(url, seconds)
        load_after = os.getloadavg()[0]
    finally:
        if loader is not None:
            loader.kill()
            loader.wait()
        stop_server(node)
    result: dict[str, Any] = {
        "engine": engine,
        "share": share,
        "streams": streams,
        "seconds": seconds,
        "engine_tokens_per_s": round(statistics.fmean(rates), 1) if rates else None,
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
        "resent_after_keep_alive_close": resent,
        "endpoints": {},
    }
    for endpoint, values in samples.items():
        result["endpoints"][endpoint] = {
            "n": len(values),
            "p50_ms": round(percentile(values, 50) * 1000, 2),
            "p99_ms": round(percentile(values, 99) * 1000, 2),
            "max_ms": round(max(values) * 1000, 2),
        }
    return result


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, headers=AUTH, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def table(results: list[dict]) -> str:
    lines = [
        f"{'engine':<9} {'share':<8} {'endpoint':<8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'n':>5} {'tok/s':>7}"
    ]
    for result in results:
        for endpoint, stats in result["endpoints"].items():
            lines.append(
                f"{result['engine']:<9} {result['share']:<8} {endpoint:<8} {stats['p50_ms']:>8.1f} "
                f"{stats['p99_ms']:>8.1f} {stats['max_ms']:>8.1f} {stats['n']:>5} "
                f"{result['engine_tokens_per_s'] or 0:>7.0f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="meridian,vllm", help="comma-separated: meridian, vllm")
    parser.add_argument("--shares", default="default,off", help="comma-separated: default, off")
    parser.add_argument("--streams", type=int, default=4, help="concurrent long streams")
    parser.add_argument("--seconds", type=float, default=20.0, help="probing time per run")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "node_api_latency.json")
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)  # the load process
    args = parser.parse_args(argv)
    if args.load:
        load_streams(args.load, args.streams)
        return 0
    engines = [engine for engine in args.engines.split(",") if engine]
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed: measuring our engine only", file=sys.stderr)
        engines.remove("vllm")
    from regional_node.checkpoints import init_checkpoint

    results = []
    with tempfile.TemporaryDirectory(prefix="meridian-node-api-") as tmp:
        work = Path(tmp)
        checkpoint = init_checkpoint(
            work / "tiny-llama",
            arch="llama",
            size="tiny",
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=MAX_MODEL_LEN,
        )
        for engine in engines:
            for share in args.shares.split(","):
                print(f"{engine}, share {share}: starting the node...", file=sys.stderr, flush=True)
                results.append(run_one(work, checkpoint, engine, share, args.streams, args.seconds))
    record = {
        "benchmark": "node_api_latency",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

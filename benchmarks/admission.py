"""Admission under overload: goodput, shed rate and time to first token against offered load, with
the gateway's admission on and off (gateway/README.md, "Overload"; issue 30).

    .venv/bin/python benchmarks/admission.py [--quick] [--duration-s 20] [--out-dir DIR]

What it does, in order:
  1. Writes a random checkpoint (`--size` `small` with `--layers` 16: slow enough per request that
     the node, not the gateway or this client on the same cores, is what runs out) and starts one
     regional node serving it with its default CPU share (`--max-num-seqs`; by default without a
     bound of its own, so that "admission off" is off
     everywhere: `--node-max-wait-s 1.0` gives it the one meridian/federation/plan.py does)
     and two gateways in front of it, `admission: {enabled: true}` (the defaults, interactive target
     `--target-s`) and `{enabled: false}`: the real CLIs, on free 127.0.0.1 ports. Tenants
     `interactive` and `batch` (policy `tier:`), no limits.
  2. Requests: streamed chat, a short prompt, `max_tokens` 16 with `ignore_eos` (fixed lengths).
     TTFT: from sending the request to the first SSE chunk carrying content. Arrivals are open
     loop (Poisson), so a slow server does not slow the offered load down.
  3. Capacity, with admission off: first a closed-loop probe (`max_num_seqs` clients back to back)
     gives a rough throughput X; then Poisson arrivals at rising fractions of X, each for
     `--sweep-s`; capacity = the highest arrival rate whose served requests' TTFT p90 is within
     the target (and none failed), stopping at the first rate that misses it.
  4. An idle burst: `max_num_seqs` interactive requests at once to the admitting gateway, the node
     idle. None should be refused.
  5. Offered interactive load at 0.25x .. 3x capacity, each for `--duration-s`: every load with
     admission on, then every load with it off. (Not taking turns: a node overloaded without
     admission queues dozens of prompts, then prefills them in steps of max_num_batched_tokens that
     take seconds on a CPU, and such steps stay in the step cost it fits and reports for a while
     after; an admitted run right after one would pay for the run before it.) Per run: offered
     rate, goodput (requests/s served with TTFT within the target), shed share (429 `overloaded`),
     TTFT p50/p99 of the served, other outcomes, the node's own TTFT and the step cost it reported
     before the run; with admission on, `meridian_gateway_admission_estimate_error_seconds`
     (observed TTFT minus admission's estimate) and the gateway queue wait of the admitted, from
     /metrics before and after, so each run has its own.
  6. Mixed (unless --no-batch): interactive at 1x capacity plus a batch tenant at 1x, both modes;
     batch's target is 60 s (its goodput: served within that).
  7. Writes admission.json and admission.png (the plot needs matplotlib, the `loadtest` extra;
     without it, only the JSON) and prints a table and the goals:
       - at 2x capacity, goodput with admission on >= 90% of the capacity measured with it off;
       - at 2x capacity, admitted interactive requests' TTFT p99 within the target;
       - the idle burst: no request refused.

Every run's requests are bounded in count (Poisson arrivals over a fixed window) and time (a
per-request timeout); all traffic goes to 127.0.0.1. The machine's other load shows in the
numbers: the JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from gateway_bench.processes import Server, free_port, start_server, stop_server, wait_until
from gateway_bench.report import percentile
from gateway_bench.systems import NODE_TOKEN, REPO, python_env
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import AdmissionConfig, TimeoutsConfig
from gateway.policy import hash_api_key
from regional_node.checkpoints import init_checkpoint

MODEL = "meridian-small"
TENANTS = {"interactive": "sk-bench-interactive", "batch": "sk-bench-batch"}
BATCH_TARGET_S = 60.0  # the gateway's default batch target_ttft_s
OUTPUT_TOKENS = 16
FACTORS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
# Of the closed-loop throughput; the sweep stops at the first rate that misses (the closed loop
# runs for seconds on a shared machine, so the capacity may be well above or below it).
SWEEP_FRACTIONS = (0.3, 0.45, 0.6, 0.75, 0.9, 1.05, 1.2, 1.4, 1.6, 1.85, 2.1, 2.4)
ESTIMATE_METRIC = "meridian_gateway_admission_estimate_error_seconds"
QUEUE_WAIT_METRIC = "meridian_gateway_queue_wait_seconds"
NODE_TTFT_METRIC = "meridian_node_time_to_first_token_seconds"
REQUEST_TIMEOUT_S = {"interactive": 20.0, "batch": 120.0}  # batch may wait 30 s in the gateway
MAX_IN_FLIGHT = 1500  # arrivals past this many unfinished requests are not sent ("client_cap")


# -- pure parts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One request: `status` 0 when no response came (timeout, connection error)."""

    tier: str
    sent_s: float  # since the run's start
    late_s: float  # how far after its scheduled arrival it was sent (the client's own lag)
    status: int
    code: str  # the error body's code ("overloaded", ...), "timeout", "" for a 200
    ttft_s: float | None


def poisson_arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival times in [0, duration_s) of a Poisson process of `rate` per second."""
    times: list[float] = []
    t = rng.expovariate(rate) if rate > 0 else duration_s
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def summarize(
    outcomes: Sequence[Outcome], *, duration_s: float, target_s: float, slo_s: float | None = None
) -> dict[str, Any]:
    """One tier of one run: rates per second of the arrival window, TTFT of the served. With
    `slo_s`, also the goodput within that looser bound."""
    served = [o.ttft_s for o in outcomes if o.status == 200 and o.ttft_s is not None]
    good = sum(1 for t in served if t <= target_s)
    shed = sum(1 for o in outcomes if o.status == 429 and o.code == "overloaded")
    kinds = Counter("ok" if o.status == 200 else f"{o.status}:{o.code}" for o in outcomes)
    n = len(outcomes)
    return {
        "requests": n,
        "offered_rps": _round(n / duration_s),
        "served": len(served),
        "goodput_rps": _round(good / duration_s),
        "good_share": _round(good / n) if n else None,
        "shed_share": _round(shed / n) if n else None,
        "ttft_p50_s": _round(percentile(served, 50)),
        "ttft_p90_s": _round(percentile(served, 90)),
        "ttft_p99_s": _round(percentile(served, 99)),
        "errors": sum(v for k, v in kinds.items() if k != "ok" and k != "429:overloaded"),
        "outcomes": dict(sorted(kinds.items())),
        "client_late_p99_s": _round(percentile([o.late_s for o in outcomes], 99)),
        **({"goodput_slo_rps": _round(sum(t <= slo_s for t in served) / duration_s)} if slo_s else {}),
    }


def sweep_holds(row: dict[str, Any], target_s: float) -> bool:
    """Every request served, with a TTFT p90 within the target."""
    p90 = row["ttft_p90_s"]
    return p90 is not None and p90 <= target_s and not row["errors"] and row["served"] == row["requests"]


def capacity_from_sweep(rows: Sequence[dict[str, Any]], target_s: float) -> float | None:
    """The highest arrival rate of the sweep (rows in rising order, a rate tried again may appear
    twice: it holds if either try did) below the first rate that missed; None when the first did."""
    capacity = None
    for rate in dict.fromkeys(row["rate_rps"] for row in rows):
        if not any(sweep_holds(row, target_s) for row in rows if row["rate_rps"] == rate):
            break
        capacity = rate
    return capacity


def histogram_buckets(metrics_text: str, name: str, labels: dict[str, str]) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts by upper bound, for one label set."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name != f"{name}_bucket":
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                buckets[float(sample.labels["le"])] = sample.value
    return buckets


def bucket_delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def _quantile(bounds: Sequence[float], cumulative: Sequence[float], q: float, lowest: float) -> float | None:
    """histogram_quantile over (bound, cumulative count) pairs; past the last finite bound, that
    bound (a lower bound of the true value)."""
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = lowest, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def error_quantiles(cumulative: dict[float, float]) -> dict[str, Any]:
    """Signed p50/p90 and absolute p50/p90 of the estimate error from its signed buckets (which
    are symmetric around 0, so |error| <= b is the count in (-b, b])."""
    bounds = sorted(cumulative)
    counts = [cumulative[b] for b in bounds]
    total = counts[-1] if counts else 0.0
    out: dict[str, Any] = {"count": int(total)}
    if total <= 0:
        return {**out, "p50_s": None, "p90_s": None, "abs_p50_s": None, "abs_p90_s": None}
    finite = [b for b in bounds if math.isfinite(b)]
    out["p50_s"] = _round(_quantile(bounds, counts, 0.5, lowest=finite[0]))
    out["p90_s"] = _round(_quantile(bounds, counts, 0.9, lowest=finite[0]))
    positive = [b for b in finite if b > 0 and -b in cumulative]
    abs_bounds = [*positive, math.inf]
    abs_counts = [cumulative[b] - cumulative[-b] for b in positive] + [total]
    out["abs_p50_s"] = _round(_quantile(abs_bounds, abs_counts, 0.5, lowest=0.0))
    out["abs_p90_s"] = _round(_quantile(abs_bounds, abs_counts, 0.9, lowest=0.0))
    out["share_over_estimate"] = _round(1 - cumulative.get(0.0, 0.0) / total)  # observed > estimate
    return out


def latency_quantiles(cumulative: dict[float, float]) -> dict[str, Any]:
    """p50/p99 of a histogram of non-negative values (from 0 up to the first bound)."""
    bounds = sorted(cumulative)
    counts = [cumulative[b] for b in bounds]
    return {
        "count": int(counts[-1]) if counts else 0,
        "p50_s": _round(_quantile(bounds, counts, 0.5, lowest=0.0)),
        "p99_s": _round(_quantile(bounds, counts, 0.99, lowest=0.0)),
    }


def goals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's goals, each with what it compares and whether it holds."""
    capacity = report["capacity"]["rps"]
    target = report["conditions"]["target_s"]
    at2 = next((r for r in report["runs"] if r["factor"] == 2.0 and r["admission"] == "on"), None)
    burst = report["idle_burst"]
    out: dict[str, dict[str, Any]] = {}
    if at2 is not None and capacity:
        goodput = at2["interactive"]["goodput_rps"]
        closed = report["capacity"].get("closed_loop_rps")
        out["goodput_at_2x_on_vs_capacity"] = {
            "goodput_rps": goodput,
            "needed_rps": _round(0.9 * capacity),
            "ratio": _round(goodput / capacity),
            # For reference: against the node kept exactly full (a stricter capacity).
            "ratio_to_closed_loop": _round(goodput / closed) if closed else None,
            "holds": goodput >= 0.9 * capacity,
        }
        p99 = at2["interactive"]["ttft_p99_s"]
        # For reference: the bound the admission defaults are built for (gateway/config.py): an
        # admitted request's estimate is within the target, and it may first wait in the gateway
        # queue up to queue_deadline_s.
        slo = target + report["conditions"].get("queue_deadline_s", 0.0)
        out["admitted_ttft_p99_at_2x_on"] = {
            "ttft_p99_s": p99,
            "target_s": target,
            "within_target_plus_queue_deadline": p99 is not None and p99 <= slo,
            "holds": p99 is not None and p99 <= target,
        }
    out["idle_burst_none_refused"] = {
        "requests": burst["requests"],
        "refused": burst["requests"] - burst["served"],
        "holds": burst["served"] == burst["requests"],
    }
    return out


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or math.isnan(x) else round(x, digits)


# -- the load client ----------------------------------------------------------------------------


def _body(i: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell me about the sea, part {i}"}],
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }


async def _request(client: httpx.AsyncClient, url: str, tier: str, i: int) -> tuple[int, str, float | None]:
    started = time.perf_counter()
    headers = {"authorization": f"Bearer {TENANTS[tier]}"}
    async with client.stream(
        "POST", f"{url}/v1/chat/completions", json=_body(i), headers=headers
    ) as response:
        if response.status_code != 200:
            body = await response.aread()
            try:
                code = json.loads(body)["error"].get("code") or json.loads(body)["error"].get("type", "")
            except (ValueError, KeyError, TypeError, AttributeError):
                code = "unparsed"
            return response.status_code, str(code), None
        ttft = None
        async for line in response.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    ttft = time.perf_counter() - started
        return 200, "" if ttft is not None else "no_content", ttft


async def _timed(
    client: httpx.AsyncClient, url: str, tier: str, i: int, start: float, scheduled: float
) -> Outcome:
    sent = time.perf_counter() - start
    try:
        status, code, ttft = await asyncio.wait_for(_request(client, url, tier, i), REQUEST_TIMEOUT_S[tier])
    except TimeoutError:
        status, code, ttft = 0, "timeout", None
    except httpx.HTTPError as exc:
        status, code, ttft = 0, type(exc).__name__, None
    return Outcome(tier, sent, max(sent - scheduled, 0.0), status, code, ttft)


async def open_loop(
    client: httpx.AsyncClient, url: str, tier: str, rate: float, duration_s: float, rng: random.Random
) -> list[Outcome]:
    """Poisson arrivals at `rate` for `duration_s`, each sent at its time whatever the others do;
    returns once every request has finished (or timed out)."""
    start = time.perf_counter()
    tasks: list[asyncio.Task[Outcome]] = []
    skipped: list[Outcome] = []
    for i, at in enumerate(poisson_arrivals(rate, duration_s, rng)):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sum(not t.done() for t in tasks[-MAX_IN_FLIGHT:]) >= MAX_IN_FLIGHT:
            skipped.append(Outcome(tier, at, 0.0, 0, "client_cap", None))
            continue
        tasks.append(asyncio.create_task(_timed(client, url, tier, i, start, at)))
    return [*await asyncio.gather(*tasks), *skipped]


async def closed_loop(client: httpx.AsyncClient, url: str, clients: int, duration_s: float) -> float:
    """Requests/s that `clients` back-to-back clients complete in `duration_s`."""
    done = 0
    end = time.perf_counter() + duration_s

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < end:
            status, _, _ = await _request(client, url, "interactive", w * 10_000 + i)
            done += status == 200
            i += 1

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(clients))), duration_s + 60)
    return done / (time.perf_counter() - start)


async def burst(client: httpx.AsyncClient, url: str, count: int) -> list[Outcome]:
    start = time.perf_counter()
    return list(
        await asyncio.gather(*(_timed(client, url, "interactive", i, start, 0.0) for i in range(count)))
    )


# -- the federation -----------------------------------------------------------------------------


@dataclass
class Federation:
    node: Server
    node_url: str
    gateways: dict[str, tuple[Server, str]]  # "on" / "off" -> (process, url)
    admin_urls: dict[str, str] = field(default_factory=dict)  # "on" / "off" -> /metrics' listener

    def url(self, mode: str) -> str:
        return self.gateways[mode][1]

    def stop(self) -> None:
        for server, _ in self.gateways.values():
            stop_server(server)
        stop_server(self.node)


def _ok(url: str, headers: dict[str, str]) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start_federation(work: Path, args: argparse.Namespace) -> Federation:
    checkpoint = init_checkpoint(
        work / "checkpoint", arch="llama", size=args.size, num_hidden_layers=args.layers
    )
    env = python_env(MERIDIAN_NODE_TOKEN=NODE_TOKEN, OMP_NUM_THREADS=str(args.node_threads))
    node_port = free_port()
    cmd = [sys.executable, "-m", "meridian.cli", "node", "--host", "127.0.0.1", "--port", str(node_port)]
    cmd += [
        "--node-id",
        "bench-node",
        "--region",
        "eu-west",
        "--jurisdiction",
        "eu",
        "--log-level",
        "warning",
    ]
    cmd += ["--model", f"{MODEL}={checkpoint}:small", "--max-num-seqs", str(args.max_num_seqs)]
    if args.node_max_wait_s > 0:
        cmd += ["--interactive-max-wait-s", str(args.node_max_wait_s)]
    node = start_server("node", cmd, log_dir=work, env=env, cwd=REPO)
    node_url = f"http://127.0.0.1:{node_port}"
    federation = Federation(node, node_url, {})
    try:
        wait_until(node, lambda: _ok(f"{node_url}/ready", {"authorization": f"Bearer {NODE_TOKEN}"}), 180)
        (work / "policies").mkdir()
        tenants = [
            {"id": tier, "api_keys": [hash_api_key(key)], "models": "*", "tier": tier}
            for tier, key in TENANTS.items()
        ]
        (work / "policies" / "bench.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
        regions = {
            "nodes": [
                {
                    "node_id": "bench-node",
                    "url": node_url,
                    "region": "eu-west",
                    "jurisdiction": "eu",
                    "models": [MODEL],
                }
            ]
        }
        (work / "regions.yaml").write_text(yaml.safe_dump(regions))
        for mode in ("on", "off"):
            port, admin_port = free_port(), free_port()
            admission: dict[str, Any] = {"enabled": mode == "on"}
            if mode == "on":
                admission["interactive"] = {
                    "target_ttft_s": args.target_s,
                    "queue_deadline_s": args.queue_deadline_s,
                    "max_queue": 256,
                }
            config = {
                "home_region": "eu-west",
                "catalog": [{"name": MODEL, "tier": "small"}],
                "policies": str(work / "policies"),
                "directory": {"type": "static", "file": str(work / "regions.yaml")},
                "listen": {"host": "127.0.0.1", "port": port},
                "admin": {"host": "127.0.0.1", "port": admin_port},  # /metrics
                "timeouts": {"probe_interval_s": args.probe_interval_s, "stream_idle_s": 60.0},
                "admission": admission,
                "ledger": {"enabled": False},
            }
            path = work / f"gateway-{mode}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            gateway = start_server(
                f"gateway-{mode}",
                [sys.executable, "-m", "meridian.cli", "gateway", "--config", str(path)],
                log_dir=work,
                env=env,
                cwd=REPO,
            )
            url = f"http://127.0.0.1:{port}"
            federation.gateways[mode] = (gateway, url)
            federation.admin_urls[mode] = f"http://127.0.0.1:{admin_port}"
            wait_until(gateway, lambda u=url: _ok(f"{u}/ready", {}), 60)
    except BaseException:
        federation.stop()
        raise
    return federation


async def wait_idle(
    client: httpx.AsyncClient, node_url: str, settle_s: float, timeout_s: float = 60.0
) -> None:
    """Until the node runs and queues nothing, then `settle_s` more (a probe reports it idle)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        load = (
            await client.get(f"{node_url}/load", headers={"authorization": f"Bearer {NODE_TOKEN}"})
        ).json()
        if load.get("num_running", 0) == 0 and load.get("num_waiting", 0) == 0:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(settle_s)


async def node_state(client: httpx.AsyncClient, node_url: str) -> dict[str, Any]:
    """What the node reports for the estimate (its /load): the gateway's admission runs on it."""
    load = (await client.get(f"{node_url}/load", headers={"authorization": f"Bearer {NODE_TOKEN}"})).json()
    model = load["per_model"][MODEL]
    keys = ("num_running", "num_waiting", "step_cost", "finish_rate", "first_token_s_by_tier")
    return {k: model.get(k) for k in keys}


async def scrape(client: httpx.AsyncClient, url: str, tier: str) -> dict[str, dict[float, float]]:
    """The admitting gateway's histograms for `tier`: the estimate's error, and the wait in its
    queue of the requests admitted from there (those admitted at once are not in it)."""
    text = (await client.get(f"{url}/metrics")).text
    return {
        "estimate_error": histogram_buckets(text, ESTIMATE_METRIC, {"model": MODEL, "tier": tier}),
        "queue_wait": histogram_buckets(text, QUEUE_WAIT_METRIC, {"tier": tier, "outcome": "admitted"}),
    }


async def scrape_node_ttft(client: httpx.AsyncClient, node_url: str) -> dict[float, float]:
    """The node's own TTFT histogram (both tiers): a slow node and a slow gateway or client
    look alike from the client; this tells them apart."""
    auth = {"authorization": f"Bearer {NODE_TOKEN}"}
    text = (await client.get(f"{node_url}/metrics", headers=auth)).text
    return histogram_buckets(text, NODE_TTFT_METRIC, {"model": MODEL})


# -- the benchmark ------------------------------------------------------------------------------


async def measure(federation: Federation, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    target = args.target_s
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT + 100, max_keepalive_connections=200)
    timeout = httpx.Timeout(10.0, read=max(REQUEST_TIMEOUT_S.values()))
    settle = args.probe_interval_s + 0.5
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        node_url = federation.node_url
        for mode in ("off", "on"):  # warm-up: the node fits its step cost, connections open
            await burst(client, federation.url(mode), 4)
        # Capacity, admission off.
        await wait_idle(client, node_url, settle)
        closed_rps = await closed_loop(client, federation.url("off"), args.max_num_seqs, args.sweep_s)
        print(f"closed loop, {args.max_num_seqs} clients: {closed_rps:.1f} requests/s", flush=True)
        sweep: list[dict[str, Any]] = []
        for fraction in SWEEP_FRACTIONS:
            rate = round(closed_rps * fraction, 2)
            # A miss may be the shared machine's noise (another process takes the cores for a
            # second): a rate fails once it has missed twice.
            for _ in range(2):
                await wait_idle(client, node_url, settle)
                node = await node_state(client, node_url)
                outcomes = await open_loop(
                    client, federation.url("off"), "interactive", rate, args.sweep_s, rng
                )
                row = {"rate_rps": rate, **summarize(outcomes, duration_s=args.sweep_s, target_s=target)}
                sweep.append({**row, "node_before": node})
                print(
                    f"  sweep {rate:7.2f}/s: served {row['served']}/{row['requests']}, "
                    f"TTFT p90 {row['ttft_p90_s']} s {row['outcomes']}",
                    flush=True,
                )
                if sweep_holds(row, target):
                    break
            if capacity_from_sweep(sweep, target) != rate:
                break
        capacity = capacity_from_sweep(sweep, target)
        capacity_note = "highest swept rate with TTFT p90 within the target"
        if capacity is None:
            capacity, capacity_note = sweep[0]["rate_rps"], "the lowest swept rate already missed the target"
        elif capacity == sweep[-1]["rate_rps"]:
            capacity_note = "every swept rate held: capacity is at least this"
        print(f"capacity: {capacity:.2f} requests/s ({capacity_note})", flush=True)
        # The idle burst, admission on.
        await wait_idle(client, node_url, settle)
        burst_node = await node_state(client, node_url)
        burst_outcomes = await burst(client, federation.url("on"), args.max_num_seqs)
        idle_burst = summarize(burst_outcomes, duration_s=1.0, target_s=target)
        idle_burst["node_before"] = burst_node
        print(f"idle burst of {args.max_num_seqs}: {idle_burst['outcomes']}", flush=True)
        # Offered load against capacity, both modes.
        runs: list[dict[str, Any]] = []
        first_scrape = await scrape(client, federation.admin_urls["on"], "interactive")
        for mode in ("on", "off"):  # on first: see the module docstring
            for factor in FACTORS:
                runs.append(
                    await _run(client, federation, mode, {"interactive": factor * capacity}, args, rng)
                )
                runs[-1]["factor"] = factor
                _print_run(runs[-1])
        last_scrape = await scrape(client, federation.admin_urls["on"], "interactive")
        estimate_all = error_quantiles(
            bucket_delta(last_scrape["estimate_error"], first_scrape["estimate_error"])
        )
        mixed: list[dict[str, Any]] = []
        if args.batch:
            for mode in ("on", "off"):
                rates = {"interactive": capacity, "batch": capacity}
                mixed.append(await _run(client, federation, mode, rates, args, rng))
                mixed[-1]["factor"] = 1.0
                _print_run(mixed[-1])
    return {
        "capacity": {
            "rps": capacity,
            "definition": "admission off, Poisson arrivals at rising rates (fractions of the closed-loop "
            "throughput): the highest rate whose served requests' TTFT p90 is within the target",
            "note": capacity_note,
            "closed_loop_rps": _round(closed_rps),
            "sweep": sweep,
        },
        "idle_burst": idle_burst,
        "runs": runs,
        "mixed": mixed,
        "estimate_error_interactive_all_runs": estimate_all,
    }


async def _run(
    client: httpx.AsyncClient,
    federation: Federation,
    mode: str,
    rates: dict[str, float],
    args: argparse.Namespace,
    rng: random.Random,
) -> dict[str, Any]:
    url = federation.url(mode)
    # Batch is held back for batch_holdoff_s (5 s) after interactive pressure: let that pass too.
    await wait_idle(client, federation.node_url, args.probe_interval_s + (5.5 if "batch" in rates else 0.5))
    admin_url = federation.admin_urls[mode]
    before = {tier: await scrape(client, admin_url, tier) for tier in rates} if mode == "on" else {}
    node_before = await node_state(client, federation.node_url)
    node_ttft_before = await scrape_node_ttft(client, federation.node_url)
    started = time.perf_counter()
    results = await asyncio.gather(
        *(open_loop(client, url, tier, rate, args.duration_s, rng) for tier, rate in rates.items())
    )
    row: dict[str, Any] = {
        "admission": mode,
        "wall_s": _round(time.perf_counter() - started, 2),
        "node_before": node_before,
        "node_ttft": latency_quantiles(
            bucket_delta(await scrape_node_ttft(client, federation.node_url), node_ttft_before)
        ),
    }
    for tier, outcomes in zip(rates, results, strict=True):
        if tier == "interactive":
            tier_target, slo = args.target_s, args.target_s + args.queue_deadline_s
        else:
            tier_target, slo = BATCH_TARGET_S, None
        row[tier] = {
            "rate_rps": _round(rates[tier]),
            **summarize(outcomes, duration_s=args.duration_s, target_s=tier_target, slo_s=slo),
        }
        if mode == "on":
            after = await scrape(client, admin_url, tier)
            row[tier]["estimate_error"] = error_quantiles(
                bucket_delta(after["estimate_error"], before[tier]["estimate_error"])
            )
            row[tier]["queue_wait_admitted"] = latency_quantiles(
                bucket_delta(after["queue_wait"], before[tier]["queue_wait"])
            )
    return row


def _print_run(row: dict[str, Any]) -> None:
    print(f"  node before: {row['node_before']['step_cost']}", flush=True)
    for tier in ("interactive", "batch"):
        if tier in row:
            r = row[tier]
            print(
                f"  {row['factor']:>4}x {row['admission']:<3} {tier:<11} offered {r['offered_rps']:6.2f}/s "
                f"goodput {r['goodput_rps']:6.2f}/s shed {r['shed_share']} p99 {r['ttft_p99_s']} "
                f"{r['outcomes']}",
                flush=True,
            )


def table(report: dict[str, Any]) -> str:
    """One line per run and tier; `<=slo/s`: goodput within target + queue deadline (interactive);
    `node p99`: the node's own TTFT; `|err|`: admission's estimate error (admission on)."""
    cols = ("offered/s", "goodput/s", "<=slo/s", "shed", "p50 s", "p99 s", "node p99", "errors")
    lines = [f"{'load':>6} {'adm':<4}" + "".join(f"{c:>10}" for c in (*cols, "|err| p50", "|err| p90"))]
    for row in [*report["runs"], *report["mixed"]]:
        for tier in ("interactive", "batch"):
            if tier not in row:
                continue
            r = row[tier]
            err = r.get("estimate_error", {})
            label = f"{row['factor']:g}x" + ("" if "batch" not in row else f" {tier[0]}")
            cells = (
                f"{r['offered_rps']:.2f}",
                f"{r['goodput_rps']:.2f}",
                _fmt(r.get("goodput_slo_rps"), ".2f"),
                _fmt(r["shed_share"], ".0%"),
                _fmt(r["ttft_p50_s"], ".3f"),
                _fmt(r["ttft_p99_s"], ".3f"),
                _fmt(row["node_ttft"]["p99_s"], ".3f"),
                str(r["errors"]),
                _fmt(err.get("abs_p50_s"), ".3f"),
                _fmt(err.get("abs_p90_s"), ".3f"),
            )
            lines.append(f"{label:>6} {row['admission']:<4}" + "".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacity = report["capacity"]["rps"]
    target = report["conditions"]["target_s"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for mode, style in (("off", "o--"), ("on", "s-")):
        rows = sorted((r for r in report["runs"] if r["admission"] == mode), key=lambda r: r["factor"])
        x = [r["interactive"]["offered_rps"] / capacity for r in rows]
        label = f"admission {mode}"
        axes[0].plot(x, [r["interactive"]["goodput_rps"] for r in rows], style, label=label)
        if mode == "on":
            slo = [r["interactive"].get("goodput_slo_rps") for r in rows]
            within = [math.nan if v is None else v for v in slo]
            axes[0].plot(x, within, "s:", color="C1", alpha=0.5, label="on, within target + queue deadline")
        axes[1].plot(x, [100 * (r["interactive"]["shed_share"] or 0) for r in rows], style, label=label)
        p99 = [r["interactive"]["ttft_p99_s"] for r in rows]
        axes[2].plot(x, [math.nan if v is None else v for v in p99], style, label=label)
    axes[0].axhline(capacity, color="grey", lw=0.8, label=f"capacity {capacity:.1f}/s")
    axes[0].axhline(0.9 * capacity, color="grey", lw=0.8, ls=":", label="90% of capacity")
    axes[2].axhline(target, color="red", lw=0.8, label=f"target {target:g} s")
    axes[2].set_yscale("log")
    titles = (
        "goodput (served within target), requests/s",
        "shed (429 overloaded), % of requests",
        "TTFT p99 of served, s",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("offered load (x capacity)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Meridian admission, interactive tier, one CPU node ({report['conditions']['model']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (6 s each, sweep 4 s)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="each offered-load run")
    parser.add_argument("--sweep-s", type=float, default=8.0, help="each capacity-sweep step")
    # The gateway's own defaults, so the benchmark measures what a deployment gets.
    interactive, timeouts = AdmissionConfig().interactive, TimeoutsConfig()
    parser.add_argument(
        "--target-s", type=float, default=interactive.target_ttft_s, help="interactive TTFT target"
    )
    parser.add_argument(
        "--queue-deadline-s",
        type=float,
        default=interactive.queue_deadline_s,
        help="interactive gateway queue wait",
    )
    parser.add_argument(
        "--probe-interval-s",
        type=float,
        default=timeouts.probe_interval_s,
        help="the gateways' probe interval",
    )
    parser.add_argument(
        "--size", default="small", help="checkpoint size (regional_node/checkpoints/sizes.py)"
    )
    # 4 layers (plain `small`) serve ~60 requests/s on two cores, where the gateway and this
    # client run out of CPU first and their lag, not the node's queue, makes the TTFT.
    parser.add_argument("--layers", type=int, default=16, help="the checkpoint's num_hidden_layers")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--node-threads", type=int, default=1, help="the node's OMP_NUM_THREADS")
    parser.add_argument(
        "--node-max-wait-s", type=float, default=0.0, help="the node's --interactive-max-wait-s; 0: none"
    )
    parser.add_argument("--no-batch", dest="batch", action="store_false", help="skip the mixed runs")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results" / "admission")
    parser.add_argument("--logs-dir", type=Path, help="copy the node's and gateways' logs here")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s, args.sweep_s = min(args.duration_s, 6.0), min(args.sweep_s, 4.0)
    load_before = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="meridian-admission-") as tmp:
        federation = start_federation(Path(tmp), args)
        try:
            measured = asyncio.run(measure(federation, args))
        finally:
            federation.stop()
            if args.logs_dir is not None:
                args.logs_dir.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.logs_dir / log.name)
    conditions = {
        "model": f"random llama {args.size}, {args.layers} layers",
        **{k: v for k, v in vars(args).items() if k not in ("out_dir", "logs_dir")},
        "output_tokens": OUTPUT_TOKENS,
        "batch_target_s": BATCH_TARGET_S,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    report = {"benchmark": "admission", "conditions": conditions, **measured}
    report["goals"] = goals(report)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "admission.json").write_text(json.dumps(report, indent=2) + "\n")
    plotted = plot(report, args.out_dir / "admission.png")
    print(
        f"\ncapacity (admission off): {report['capacity']['rps']:.2f} requests/s; target {args.target_s:g} s"
    )
    print(table(report))
    est = report["estimate_error_interactive_all_runs"]
    print(
        f"estimate error (observed - estimate), interactive, all runs: n={est['count']} "
        f"|err| p50 {est['abs_p50_s']} s p90 {est['abs_p90_s']} s; signed p50 {est['p50_s']} p90 {est['p90_s']}"
    )
    for name, goal in report["goals"].items():
        print(f"goal {name}: {'holds' if goal['holds'] else 'FAILS'} {json.dumps(goal)}")
    print(
        f"wrote {args.out_dir / 'admission.json'}"
        + (" and admission.png" if plotted else " (no matplotlib: no plot)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cache-aware fleet routing on real nodes (issue 35): TTFT, throughput and prefix-cache hits per
routing policy, on three small nodes on this machine.

    .venv/bin/python benchmarks/fleet_routing.py [--quick] [--rounds N] [--workloads ...]
        [--policies ...] [--cost-params NAME=VALUE ...] [--out-dir DIR]

What it does:
  1. Writes a random `small` Llama checkpoint (`meridian model init --size small`) and starts
     `--nodes` regional nodes serving it (the real CLI, 127.0.0.1, free ports), plus one gateway
     in front of all of them (static directory) for the `gateway` policy.
  2. Policies. All but `gateway` route here, in this process, on the gateway's own prober
     (gateway/health/probes.py: /load every 0.25 s, the prefix tables mirrored) and send straight
     to the chosen node, so each sees the same nodes through the same reports:
       - random: a node drawn at random;  - round-robin;
       - least-load: the lowest load score (router/load.py), ties at random;
       - bands: the router before issue 35: (saturated, load band, rendezvous rank of the
         gateway's affinity key);
       - cost: `router.route` (estimated TTFT: queue wait + uncached prefill; issue 35);
       - gateway: the real gateway (the same `route`, wired through its request pipeline).
  3. Workloads (fresh tenants and chats for every policy, so no run reuses another's cache):
       - many-tenants: 12 tenants, each with its own ~1,000-token system prompt, 144 streamed
         requests at concurrency 4 (the measurement in the issue);
       - multi-turn: 8 chats of 5 turns (a ~600-token opening message each, the replies carried
         back), 4 chats at a time;
       - hot-prefix: one system prompt for every request, 96 requests at concurrency 6.
     Requests: streamed chat, `max_tokens` 16 with `ignore_eos`. TTFT: from sending to the first
     content chunk. Cached tokens: the node's usage (`prompt_tokens_details.cached_tokens`).
  4. Per (workload, policy, round): TTFT p50/p90, output tokens/s, requests and hit rate per node,
     the hit rate against the ideal (each prefix computed once in the whole fleet: a request's
     ideal cached tokens are the most any run cached for its position, 0 for a prefix's first
     request), the cold prefills, and `prefix_not_ready`: requests sent before any request of
     their group had its first token (no router can serve those from a ready prefix; when they
     are over 10% of the requests, p90 is one of them). `--rounds N` alternates the policies N
     times (fresh tenants each): this machine's load drifts, so ratios are taken within a round.
     Every request's row has its route reason: the gateway's x-meridian-route, or for `cost`
     every node's cost (`--cost-params` sets RoutingParams for `cost` alone, to compare a
     setting against the gateway's defaults in one run).
  5. Writes fleet_routing.json and fleet_routing.png (matplotlib, if installed), prints a table
     (medians over the rounds) and the goals on the median of the same-run ratios, with each
     round's: many-tenants TTFT p90 >= 3x lower than random; hit rate >= 80% of ideal; hot-prefix
     p90 within 1.5x of the spread case (round-robin: every node prefills the prompt once, then
     holds it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from gateway_bench.processes import Server, free_port, start_server, stop_server, wait_until
from gateway_bench.report import percentile
from gateway_bench.systems import NODE_TOKEN, REPO, python_env

from gateway.health.probes import NodeProber
from gateway.http import ConnectionPool
from gateway.policy import hash_api_key
from protocol.prefix_cache import conversation_of
from regional_node.checkpoints import init_checkpoint
from router import FleetSnapshot, NodeInfo, RouteRequest, rendezvous_rank, route
from router.load import is_saturated, load_band, load_score
from router.params import DEFAULT_PARAMS
from router.types import TenantPolicy

MODEL = "meridian-small"
API_KEY = "sk-bench-fleet"
OUTPUT_TOKENS = 16
POLICIES = ("random", "round-robin", "least-load", "bands", "cost", "gateway")
WORKLOADS = ("many-tenants", "multi-turn", "hot-prefix")
WORDS = (
    "ledger invoice harbour quartz meadow lantern orbit copper violet saddle thunder whisper canyon "
    "pepper marble velvet falcon ember glacier summit timber anchor beacon cobalt dune fable garnet "
    "hazel ivory jasper kelp lagoon mosaic nectar oasis prism quill raven sierra tundra umber vortex"
).split()


@dataclass(frozen=True)
class Request:
    group: str  # the prefix it shares (a tenant, a chat); its first request cannot hit
    position: str  # workload-relative slot, the same across policies (for the ideal)
    messages: list[dict[str, str]]


@dataclass
class Result:
    node: str
    position: str
    group: str
    ttft_s: float | None
    status: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reply: str = ""
    sent_at: float = 0.0  # time.perf_counter() when sent
    route: str = ""  # why it went there: the gateway's x-meridian-route, or every target's cost here


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


# -- routing policies (client side) ---------------------------------------------------------


class Router:
    def __init__(self, nodes: Sequence[NodeInfo], prober: NodeProber, rng: random.Random) -> None:
        self.nodes, self.prober, self.rng = list(nodes), prober, rng
        self._turn = itertools.count()
        self.tenant = TenantPolicy(tenant_id="bench", api_key_hashes=frozenset())
        self.params = DEFAULT_PARAMS  # the `cost` policy's (--cost-params); the gateway runs the defaults

    def snapshot(self) -> list[NodeInfo]:
        out = []
        for n in self.nodes:
            result = self.prober.result(n.node_id)
            out.append(dataclasses.replace(n, load=result.load if result else None))
        return out

    def pick(
        self, policy: str, messages: list[dict[str, str]], prompt_tokens: int, request_id: str
    ) -> tuple[NodeInfo, str]:
        """The node, and for `cost` every target's reason (what each node cost), for a closer look."""
        nodes = self.snapshot()
        if policy == "random":
            return self.rng.choice(nodes), ""
        if policy == "round-robin":
            return nodes[next(self._turn) % len(nodes)], ""
        if policy == "least-load":
            best = min(load_score(n.load, DEFAULT_PARAMS) for n in nodes)
            return self.rng.choice([n for n in nodes if load_score(n.load, DEFAULT_PARAMS) == best]), ""
        key = "\x00".join(f"{m['role']}:{m['content']}" for m in messages[:2])[:512]
        if policy == "bands":
            rank = {i: r for r, i in enumerate(rendezvous_rank(key, [n.node_id for n in nodes]))}
            return min(
                nodes,
                key=lambda n: (
                    is_saturated(n.load, DEFAULT_PARAMS),
                    load_band(n.load, DEFAULT_PARAMS),
                    rank[n.node_id],
                ),
            ), ""
        assert policy == "cost"
        request = RouteRequest(
            MODEL,
            home_region="eu-west",
            affinity_key=key,
            conversation=conversation_of(messages),
            prompt_tokens=prompt_tokens,
        )
        decision = route(request, self.tenant, FleetSnapshot(nodes=tuple(nodes)), params=self.params)
        targets = decision.targets
        if decision.prefill is not None:  # the overlay, as the gateway keeps it
            self.prober.routed(targets[0].target_id, decision.prefill, key=request_id)
        why = " | ".join(f"{t.target_id}:{t.reason}" for t in targets)
        return next(n for n in nodes if n.node_id == targets[0].target_id), why


# -- requests ---------------------------------------------------------------------------------


async def send(client: httpx.AsyncClient, url: str, headers: dict[str, str], req: Request) -> Result:
    body = {
        "model": MODEL,
        "messages": req.messages,
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    result = Result(node="", position=req.position, group=req.group, ttft_s=None, sent_at=start)
    parts: list[str] = []
    try:
        return await _stream(client, url, headers, body, start, result, parts)
    except httpx.HTTPError:  # a dropped connection is a failed request, not the end of the run
        return result


async def _stream(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    start: float,
    result: Result,
    parts: list[str],
) -> Result:
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        result.node = response.headers.get("x-meridian-node", "")
        result.route = response.headers.get("x-meridian-route", "")
        result.status = response.status_code
        if response.status_code != 200:
            # A refusal's reason, where the route would be: which stage refused it, and why.
            result.route = (await response.aread()).decode(errors="replace")[:300]
            return result
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if result.ttft_s is None:
                        result.ttft_s = time.perf_counter() - start
                    parts.append(content)
            usage = chunk.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens", 0)
                result.completion_tokens = usage.get("completion_tokens", 0)
                details = usage.get("prompt_tokens_details") or {}
                result.cached_tokens = details.get("cached_tokens") or 0
    result.reply = "".join(parts)
    return result


def estimate_tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].encode()) // 4 + 4 for m in messages)


class Runner:
    def __init__(self, router: Router, gateway_url: str, client: httpx.AsyncClient) -> None:
        self.router, self.gateway_url, self.client = router, gateway_url, client
        self._ids = itertools.count()

    async def one(self, policy: str, req: Request) -> Result:
        if policy == "gateway":
            headers = {"authorization": f"Bearer {API_KEY}"}
            return await send(self.client, self.gateway_url, headers, req)
        request_id = f"bench-{next(self._ids)}"
        node, why = self.router.pick(policy, req.messages, estimate_tokens(req.messages), request_id)
        headers = {"authorization": f"Bearer {NODE_TOKEN}", "x-meridian-tenant": "bench"}
        result = await send(self.client, node.url, headers, req)
        # As the gateway does when the stream ends (it also says when its first chunk came).
        self.router.prober.moved(node.node_id, request_id, "done" if result.ttft_s is not None else None)
        result.node = result.node or node.node_id
        result.route = why
        return result

    async def pool(self, policy: str, requests: Sequence[Request], concurrency: int) -> list[Result]:
        queue = list(reversed(requests))
        results: list[Result] = []

        async def worker() -> None:
            while queue:
                results.append(await self.one(policy, queue.pop()))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results

    async def chats(
        self, policy: str, rng: random.Random, chats: int, turns: int, at_once: int
    ) -> list[Result]:
        results: list[Result] = []
        system = "You are a patient assistant who answers in full sentences."
        pending = list(range(chats))

        async def chat(c: int) -> None:
            messages = [{"role": "system", "content": system}]
            for t in range(turns):
                opener = f"Chat {c} {rng.random():.6f}: " + text(rng, 450) if t == 0 else text(rng, 12)
                messages.append({"role": "user", "content": opener})
                result = await self.one(policy, Request(f"chat{c}", f"chat{c}/turn{t}", list(messages)))
                results.append(result)
                messages.append({"role": "assistant", "content": result.reply or "ok"})

        async def worker() -> None:
            while pending:
                await chat(pending.pop(0))

        await asyncio.gather(*(worker() for _ in range(at_once)))
        return results


def many_tenants(rng: random.Random, tenants: int, per_tenant: int) -> list[Request]:
    prompts = [f"Tenant {t} {rng.random():.6f}. " + text(rng, 780) for t in range(tenants)]
    counts = [0] * tenants
    order = [t for t in range(tenants) for _ in range(per_tenant)]
    rng.shuffle(order)
    out = []
    for t in order:
        counts[t] += 1
        messages = [{"role": "system", "content": prompts[t]}, {"role": "user", "content": text(rng, 10)}]
        out.append(Request(f"t{t}", f"t{t}/{counts[t]}", messages))
    return out


def hot_prefix(rng: random.Random, count: int) -> list[Request]:
    prompt = f"Hot {rng.random():.6f}. " + text(rng, 780)
    return [
        Request(
            "hot",
            f"hot/{i}",
            [{"role": "system", "content": prompt}, {"role": "user", "content": text(rng, 10)}],
        )
        for i in range(count)
    ]


# -- summary ---------------------------------------------------------------------------------


def summarize(results: Sequence[Result], wall_s: float) -> dict[str, Any]:
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    per_node: dict[str, dict[str, int]] = defaultdict(lambda: {"requests": 0, "prompt": 0, "cached": 0})
    for r in results:
        n = per_node[r.node or "?"]
        n["requests"] += 1
        n["prompt"] += r.prompt_tokens
        n["cached"] += r.cached_tokens
    prompt = sum(r.prompt_tokens for r in results)
    # When each group's prefix was first computed anywhere: its earliest first token.
    ready: dict[str, float] = {}
    for r in results:
        if r.ttft_s is not None:
            ready[r.group] = min(ready.get(r.group, math.inf), r.sent_at + r.ttft_s)
    return {
        "requests": len(results),
        # Prefilled cold (nothing of the prompt cached where it ran); the ideal is one per group.
        "cold_prefills": sum(1 for r in results if r.ttft_s is not None and r.cached_tokens == 0),
        # Sent before any request of its group had its first token: no router can give these a
        # cached prefix without a wait, so when they exceed 10% of the requests, p90 is one of them.
        "prefix_not_ready": sum(1 for r in results if r.sent_at < ready.get(r.group, math.inf)),
        "failed": sum(1 for r in results if r.ttft_s is None),
        "failed_statuses": sorted({r.status for r in results if r.ttft_s is None}),
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1000, 1) if ttfts else None,
        "ttft_p90_ms": round(percentile(ttfts, 90) * 1000, 1) if ttfts else None,
        "output_tok_s": round(sum(r.completion_tokens for r in results) / wall_s, 1),
        "hit_rate": round(sum(r.cached_tokens for r in results) / prompt, 3) if prompt else 0.0,
        "per_node": {
            node: {
                "requests": v["requests"],
                "hit_rate": round(v["cached"] / v["prompt"], 3) if v["prompt"] else 0.0,
            }
            for node, v in sorted(per_node.items())
        },
        "wall_s": round(wall_s, 1),
    }


def ideal_hit_rates(runs: dict[str, list[Result]]) -> float:
    """Each prefix computed once in the fleet: a request's ideal cached tokens are the most any
    policy's run cached at its position (0 for the first request of its group)."""
    best: dict[str, int] = defaultdict(int)
    for results in runs.values():
        for r in results:
            best[r.position] = max(best[r.position], r.cached_tokens)
    rates = []
    for results in runs.values():
        seen: set[str] = set()
        ideal = prompt = 0
        for r in results:  # completion order: a group's first finisher counts as its first
            if r.group in seen:
                ideal += min(best[r.position], r.prompt_tokens)
            seen.add(r.group)
            prompt += r.prompt_tokens
        rates.append(ideal / prompt if prompt else 0.0)
    return max(rates) if rates else 0.0


# -- the fleet -------------------------------------------------------------------------------


def start_fleet(work: Path, args: argparse.Namespace) -> tuple[list[Server], list[NodeInfo], str]:
    checkpoint = init_checkpoint(work / "checkpoint", arch="llama", size="small")
    env = python_env(MERIDIAN_NODE_TOKEN=NODE_TOKEN, OMP_NUM_THREADS="1")
    servers: list[Server] = []
    nodes: list[NodeInfo] = []
    for i in range(args.nodes):
        port = free_port()
        node_id = f"node-{i}"
        cmd = [sys.executable, "-m", "meridian.cli", "node", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--node-id", node_id, "--region", "eu-west", "--jurisdiction", "eu", "--log-level", "warning"]
        # Nothing is refused (the node's own admission would shed cold prefills on a busy
        # machine): the benchmark compares where requests go, not how many are let in.
        cmd += ["--model", f"{MODEL}={checkpoint}:small", "--interactive-max-wait-s", "600"]
        servers.append(start_server(node_id, cmd, log_dir=work, env=env, cwd=REPO))
        nodes.append(
            NodeInfo(
                node_id=node_id,
                url=f"http://127.0.0.1:{port}",
                region="eu-west",
                jurisdiction="eu",
                models=frozenset({MODEL}),
            )
        )
    for server, node in zip(servers, nodes, strict=True):
        wait_until(
            server, lambda u=node.url: _ok(f"{u}/ready", {"authorization": f"Bearer {NODE_TOKEN}"}), 300
        )
    (work / "policies").mkdir()
    tenant = {"id": "bench", "api_keys": [hash_api_key(API_KEY)], "models": "*", "tier": "interactive"}
    (work / "policies" / "bench.yaml").write_text(yaml.safe_dump({"tenants": [tenant]}))
    directory = {
        "nodes": [
            {
                "node_id": n.node_id,
                "url": n.url,
                "region": n.region,
                "jurisdiction": n.jurisdiction,
                "models": [MODEL],
            }
            for n in nodes
        ]
    }
    (work / "regions.yaml").write_text(yaml.safe_dump(directory))
    port = free_port()
    config = {
        "home_region": "eu-west",
        "catalog": [{"name": MODEL, "tier": "small"}],
        "policies": str(work / "policies"),
        "directory": {"type": "static", "file": str(work / "regions.yaml")},
        "listen": {"host": "127.0.0.1", "port": port},
        "ledger": {"enabled": False},
        # As the nodes: nothing shed, only routed; --gateway-admission keeps the gateway's
        # default admission (an interactive target of 0.5 s), as a deployment would run it.
        **({} if args.gateway_admission else {"admission": {"enabled": False}}),
    }
    (work / "gateway.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    gateway = start_server(
        "gateway",
        [sys.executable, "-m", "meridian.cli", "gateway", "--config", str(work / "gateway.yaml")],
        log_dir=work,
        env=env,
        cwd=REPO,
    )
    servers.append(gateway)
    url = f"http://127.0.0.1:{port}"
    wait_until(gateway, lambda: _ok(f"{url}/ready", {}), 120)
    return servers, nodes, url


def _ok(url: str, headers: dict[str, str]) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class _Directory:
    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self.nodes = tuple(nodes)

    def snapshot(self) -> tuple[NodeInfo, ...]:
        return self.nodes


async def measure(nodes: list[NodeInfo], gateway_url: str, args: argparse.Namespace) -> dict[str, Any]:
    prober = NodeProber(
        _Directory(nodes),
        ConnectionPool(connect_timeout_s=2.0),
        interval_s=0.25,
        timeout_s=2.0,
        headers={"authorization": f"Bearer {NODE_TOKEN}"},
    )
    await prober.start()
    rng = random.Random(args.seed)
    scale = 0.5 if args.quick else 1.0
    workloads: dict[str, Callable[[Runner, str], Any]] = {
        "many-tenants": lambda run, p: run.pool(p, many_tenants(rng, 12, max(2, int(12 * scale))), 4),
        "multi-turn": lambda run, p: run.chats(p, rng, max(4, int(8 * scale)), 5, 4),
        "hot-prefix": lambda run, p: run.pool(p, hot_prefix(rng, max(24, int(96 * scale))), 6),
    }
    workloads = {name: w for name, w in workloads.items() if name in args.workloads}
    report: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(timeout=120.0) as client:
            router = Router(nodes, prober, rng)
            router.params = dataclasses.replace(DEFAULT_PARAMS, **args.cost_params)
            runner = Runner(router, gateway_url, client)
            for name, workload in workloads.items():
                rounds = []
                # Rounds alternate the policies (a, b, a, b, ...): this machine's load drifts, and a
                # ratio is only fair between runs close in time.
                for turn in range(args.rounds):
                    rounds.append(await one_round(runner, name, workload, args.policies, turn))
                report[name] = {"policies": pooled(rounds), "rounds": rounds}
    finally:
        await prober.stop()
    return report


async def one_round(
    runner: Runner, name: str, workload: Callable[[Runner, str], Any], policies: Sequence[str], turn: int
) -> dict[str, Any]:
    runs: dict[str, list[Result]] = {}
    rows: dict[str, Any] = {}
    for policy in policies:
        start = time.perf_counter()
        results = await workload(runner, policy)
        rows[policy] = summarize(results, time.perf_counter() - start)
        runs[policy] = results
        print(f"{name:13s} round {turn} {policy:12s} {json.dumps(rows[policy])}", flush=True)
        await asyncio.sleep(1.0)
    ideal = ideal_hit_rates(runs)
    for row in rows.values():
        row["hit_rate_of_ideal"] = round(row["hit_rate"] / ideal, 3) if ideal else None
    return {
        "ideal_hit_rate": round(ideal, 3),
        "policies": rows,
        # Every request, in completion order, for a closer look: position, node, status, TTFT s,
        # prompt tokens, cached tokens, sent at (s from the run's first), route reason(s).
        "requests": {
            policy: [
                [
                    r.position,
                    r.node,
                    r.status,
                    r.ttft_s and round(r.ttft_s, 4),
                    r.prompt_tokens,
                    r.cached_tokens,
                    round(r.sent_at - first_sent, 3),
                    r.route,
                ]
                for first_sent in [min((r.sent_at for r in results), default=0.0)]
                for r in results
            ]
            for policy, results in runs.items()
        },
    }


def pooled(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each policy over the rounds: the median of each figure, and every round's p90."""
    out: dict[str, Any] = {}
    for policy in rounds[0]["policies"]:
        rows = [r["policies"][policy] for r in rounds]
        row = dict(rows[len(rows) // 2])  # the per-node split of one (the middle) round
        for key in ("ttft_p50_ms", "ttft_p90_ms", "output_tok_s", "hit_rate", "hit_rate_of_ideal", "wall_s"):
            values = [r[key] for r in rows if r[key] is not None]
            row[key] = round(statistics.median(values), 3) if values else None
        row["failed"] = sum(r["failed"] for r in rows)
        row["ttft_p90_ms_rounds"] = [r["ttft_p90_ms"] for r in rows]
        out[policy] = row
    return out


def _ratios(block: dict[str, Any], top: str, bottom: str) -> list[float]:
    """top's p90 / bottom's p90 in each round (the same-run ratio)."""
    return [
        round(r["policies"][top]["ttft_p90_ms"] / r["policies"][bottom]["ttft_p90_ms"], 2)
        for r in block["rounds"]
        if r["policies"][top]["ttft_p90_ms"] and r["policies"][bottom]["ttft_p90_ms"]
    ]


def goals(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals, each on the median of the same-run ratios, with every round's ratio."""
    out: dict[str, Any] = {}
    many = report.get("many-tenants", {})
    for policy in ("cost", "gateway"):
        if policy in many.get("policies", {}) and "random" in many["policies"]:
            ratios = _ratios(many, "random", policy)
            ratio = statistics.median(ratios)
            out[f"many-tenants p90 random/{policy} >= 3"] = {
                "value": ratio,
                "rounds": ratios,
                "met": ratio >= 3,
            }
            of_ideal = many["policies"][policy]["hit_rate_of_ideal"]
            out[f"many-tenants {policy} hit rate >= 0.8 of ideal"] = {
                "value": of_ideal,
                "met": of_ideal >= 0.8,
            }
    hot = report.get("hot-prefix", {})
    for policy in ("cost", "gateway"):
        if policy in hot.get("policies", {}) and "round-robin" in hot["policies"]:
            ratios = _ratios(hot, policy, "round-robin")
            ratio = statistics.median(ratios)
            out[f"hot-prefix p90 {policy}/spread <= 1.5"] = {
                "value": ratio,
                "rounds": ratios,
                "met": ratio <= 1.5,
            }
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        "| workload | policy | TTFT p50 ms | TTFT p90 ms | out tok/s | hit rate (of ideal) | requests per node |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, block in report["workloads"].items():
        for policy, row in block["policies"].items():
            per_node = " / ".join(str(v["requests"]) for v in row["per_node"].values())
            lines.append(
                f"| {name} | {policy} | {row['ttft_p50_ms']} | {row['ttft_p90_ms']} | {row['output_tok_s']} | "
                f"{row['hit_rate']} ({row['hit_rate_of_ideal']}) | {per_node} |"
            )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(report["workloads"])
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        rows = report["workloads"][name]["policies"]
        ax.bar(list(rows), [r["ttft_p90_ms"] or 0 for r in rows.values()])
        ax.set_title(f"{name}: TTFT p90 (ms)")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="half the requests")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument(
        "--cost-params",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="RoutingParams for the client-side `cost` policy only (to compare a setting with the gateway's defaults in one run)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternating rounds of every policy (fresh tenants each)"
    )
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results" / "fleet_routing")
    parser.add_argument(
        "--gateway-admission",
        action="store_true",
        help="run the gateway with its default admission control (refused requests count as failed)",
    )
    args = parser.parse_args(argv)
    args.cost_params = {k: float(v) for k, v in (p.split("=", 1) for p in args.cost_params)}
    with tempfile.TemporaryDirectory(prefix="fleet-routing-") as tmp:
        work = Path(tmp)
        servers, nodes, gateway_url = start_fleet(work, args)
        try:
            workloads = asyncio.run(measure(nodes, gateway_url, args))
            # What the nodes fitted (fleet_sim.py's --calibration reads them).
            step_costs = [
                next(
                    iter(
                        httpx.get(
                            f"{n.url}/load", headers={"authorization": f"Bearer {NODE_TOKEN}"}, timeout=10
                        )
                        .json()["per_model"]
                        .values()
                    )
                )["step_cost"]
                for n in nodes
            ]
        finally:
            for server in servers:
                stop_server(server)
    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "args": {k: str(v) for k, v in vars(args).items()},
        "workloads": workloads,
    }
    report["goals"] = goals(workloads)
    report["step_costs"] = step_costs
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "fleet_routing.json").write_text(json.dumps(report, indent=2))
    plotted = plot(report, args.out_dir / "fleet_routing.png")
    print(table(report))
    for goal, value in report["goals"].items():
        rounds = f" (rounds: {value['rounds']})" if "rounds" in value else ""
        print(f"{goal}: {value['value']}{rounds} {'met' if value['met'] else 'MISSED'}")
    print(f"wrote {args.out_dir / 'fleet_routing.json'}" + (" and fleet_routing.png" if plotted else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A discrete-event simulation of the fleet at a scale this machine cannot run (issue 35): the real
router (`router.route`, pure) driving modelled nodes, policies compared as in fleet_routing.py.

    .venv/bin/python benchmarks/fleet_sim.py [--quick] [--calibration benchmarks/results/fleet_routing/fleet_routing.json]

The fleet: 64 nodes in 4 regions (16 each), 1,000 tenants spread over the regions (home region
preferred, as the gateway does). A node model, per request:
  - a sequence slot (`max_num_seqs`; requests without one wait, FCFS);
  - prefill as the node's scheduler runs it with partial prefills (`--threshold`, the engine's
    `long_prefill_token_threshold`, 256 by default; 0: one prompt after another): prompts with
    more uncached tokens than the threshold are long and go through one FCFS server per node,
    `base_s + per_token_s * uncached tokens` each (in 256-token chunks a lone 2,084-token prompt
    took 3% longer than in one step on this machine, so the chunks' overhead is left out); a short
    one skips them, its first token one step later, that step carrying a long prompt's chunk
    beside it. `StepCost` is the step cost the real node fits (from `--calibration`, a fleet_routing.json: the step
    costs the benchmark's nodes reported; else the defaults below, measured the same way on this
    machine);
  - the first token when its prefill ends; then `output` decode steps of
    `base_s + per_token_s * running` each; the slot is freed at the end;
  - a prefix cache: LRU of message-prefix names (protocol/prefix_cache.py) to their tokens, at most
    `--kv-tokens` tokens; a request's prefixes enter at its prefill, the longest present is cached.
The router sees what a gateway sees: each node's `/load` (queue, slots, step cost, finish rate)
and its published prefix table, refreshed every `--probe-s` (0.25 s, the gateway's default), so
it routes on reports up to a probe old, as the real one does.

Load: a day compressed into `--day-s` seconds, diurnal (`--trough`..`--peak` requests/s, a sine),
with a spike of 20x the trough for `--spike-s` at 60% of the day. Tenants' popularity is Zipf
(s=1); system prompts 400..2,000 tokens; 30% of sessions are chats of up to 5 turns (the reply
carried back, 20 s think time), the rest single requests; outputs 32..256 tokens.

Policies: random, round-robin, least-load, bands (the order before issue 35), cost-reports (the
router on the reports alone) and cost (the router with the gateway's overlay of the requests it
routed since each report, as gateway/health/probes.py keeps it).

Reported per policy: TTFT p50/p90/p99 over the day and during the spike, prefix-cache hit rate,
the busiest node's share of requests, and the routing decision's own cost (CPU time of one
`route` call at 64 nodes, p50/p99; goal <= 1 ms).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import itertools
import json
import math
import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.health.probes import Overlay
from protocol.first_token import StepCost
from protocol.prefix_cache import prefix_names
from router import FleetSnapshot, ModelQueue, NodeInfo, NodeLoad, RouteRequest, rendezvous_rank, route
from router.load import is_saturated, load_band, load_score
from router.params import DEFAULT_PARAMS
from router.types import Overlaid, TenantPolicy

MODEL = "m"
REGIONS = ("eu-west", "eu-central", "us-east", "us-west")
JURISDICTION = {"eu-west": "eu", "eu-central": "eu", "us-east": "us", "us-west": "us"}
POLICIES = ("random", "round-robin", "least-load", "bands", "cost-reports", "cost")
# How long the gateway keeps a routed request in its overlay (gateway/health/probes.py).
OVERLAY_KEPT_S = 2.0
BLOCK = 16
# The step cost the small CPU nodes of fleet_routing.py fitted and reported in /load on this
# (shared, busy) machine: the median of three, 2026-11-27; --calibration reads a fresh run's.
DEFAULT_STEP = StepCost(base_s=0.1035, per_token_s=0.00166)
POLICY = TenantPolicy(tenant_id="sim", api_key_hashes=frozenset())


@dataclass
class Req:
    rid: int
    tenant: int
    region: str
    conversation: tuple[tuple[str, str], ...]
    tokens: list[int]  # cumulative tokens after each message
    output: int
    arrival: float
    chat: tuple[int, int] | None = None  # (chat id, turns left)
    node: int = -1
    cached: int = 0
    first_token: float | None = None
    long: bool = True  # waits for the node's long prefills ahead of it


@dataclass
class SimNode:
    index: int
    info: NodeInfo
    step: StepCost
    max_num_seqs: int
    kv_tokens: int
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)
    cache_size: int = 0
    slot_wait: deque[Req] = field(default_factory=deque)
    prefill: deque[Req] = field(default_factory=deque)
    prefill_busy: bool = False
    running: int = 0
    finished: deque[float] = field(default_factory=deque)
    waiting_tokens: int = 0
    threshold: int = 0  # the scheduler's long_prefill_token_threshold

    def lookup(self, names: tuple[str, ...]) -> int:
        for name in reversed(names):
            if name in self.cache:
                self.cache.move_to_end(name)
                return self.cache[name]
        return 0

    def insert(self, names: tuple[str, ...], tokens: list[int]) -> None:
        for name, t in zip(names, tokens, strict=True):
            t = t // BLOCK * BLOCK
            if t <= 0:
                continue
            if name in self.cache:
                self.cache.move_to_end(name)
                continue
            self.cache[name] = t
            self.cache_size += t
        while self.cache_size > self.kv_tokens and self.cache:
            _, t = self.cache.popitem(last=False)
            self.cache_size -= t

    def report(self, now: float) -> NodeLoad:
        while self.finished and self.finished[0] < now - 10.0:
            self.finished.popleft()
        waiting = len(self.slot_wait) + len(self.prefill)
        queue = ModelQueue(
            waiting_tokens=self.waiting_tokens,
            waiting_tokens_by_tier={"interactive": self.waiting_tokens},
            waiting_requests_by_tier={"interactive": waiting},
            num_running=self.running,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=2048,
            long_prefill_token_threshold=self.threshold,
            step_cost=self.step,
            finish_rate=len(self.finished) / 10.0,
        )
        return NodeLoad(
            kv_cache_usage=min(self.running / self.max_num_seqs, 1.0),
            waiting_tokens=self.waiting_tokens,
            num_running=self.running,
            num_waiting=waiting,
            models={MODEL: queue},
            cached_prefixes=dict(self.cache),
            asked_at=now,
        )


def text(head: str, tokens: int) -> str:
    """A message of about `tokens` tokens at the gateway's 4 bytes a token."""
    return head + " " + "x" * max(4 * tokens - len(head) - 1, 0)


class Sim:
    def __init__(self, args: argparse.Namespace, policy: str, step: StepCost) -> None:
        self.args, self.policy = args, policy
        self.params = dataclasses.replace(DEFAULT_PARAMS, **args.params)
        self.rng = random.Random(args.seed)
        self.route_rng = random.Random(args.seed + 1)
        self.nodes = [
            SimNode(
                i,
                NodeInfo(
                    node_id=f"{REGIONS[i % 4]}-{i // 4}",
                    url="",
                    region=REGIONS[i % 4],
                    jurisdiction=JURISDICTION[REGIONS[i % 4]],
                    models=frozenset({MODEL}),
                ),
                step,
                args.max_num_seqs,
                args.kv_tokens,
                threshold=args.threshold,
            )
            for i in range(args.nodes)
        ]
        self.by_id = {n.info.node_id: n for n in self.nodes}
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.snapshot = FleetSnapshot()
        self.done: list[Req] = []
        self.decision_s: list[float] = []
        self.turn = itertools.count()
        zipf = [1.0 / (k + 1) for k in range(args.tenants)]
        total = sum(zipf)
        self.popularity = list(itertools.accumulate(w / total for w in zipf))
        self.system_tokens = [self.rng.randint(400, 2000) for _ in range(args.tenants)]
        self.tenant_region = [REGIONS[self.rng.randrange(4)] for _ in range(args.tenants)]
        # Texts as long as their tokens (the gateway's 4 bytes a token): the router shares a
        # request's estimate out over its messages by their bytes.
        self.system_text = [text(f"tenant {t}", n) for t, n in enumerate(self.system_tokens)]
        # The gateway's overlay (cost policy): what it routed to each node, with when, summed as
        # the gateway's prober keeps it.
        self.routed = Overlay(kept_s=OVERLAY_KEPT_S)
        # By node id: (its report entry, its overlay, the entry with it), reused while both are
        # the same objects, as the gateway's fleet snapshot does (gateway/upstreams/fleet.py).
        self._with_overlay: dict[str, tuple[NodeInfo, Overlaid, NodeInfo]] = {}
        self.chat_ids = itertools.count()
        self.request_ids = itertools.count()

    def push(self, t: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    # -- load ------------------------------------------------------------------------------
    def rate(self, t: float) -> float:
        a = self.args
        diurnal = a.trough + (a.peak - a.trough) * 0.5 * (1 - math.cos(2 * math.pi * t / a.day_s))
        spike_at = 0.6 * a.day_s
        return 20 * a.trough if spike_at <= t < spike_at + a.spike_s else diurnal

    def new_session(self, t: float) -> Req:
        tenant = min(self._bisect(self.rng.random()), self.args.tenants - 1)
        system = self.system_tokens[tenant]
        user = self.rng.randint(20, 200)
        conversation = (("system", self.system_text[tenant]), ("user", text(f"q {next(self.turn)}", user)))
        chat = (next(self.chat_ids), self.rng.randint(1, 4)) if self.rng.random() < 0.3 else None
        return Req(
            next(self.request_ids),
            tenant,
            self.tenant_region[tenant],
            conversation,
            [system, system + user],
            self.rng.randint(32, 256),
            t,
            chat,
        )

    def _bisect(self, x: float) -> int:
        lo, hi = 0, len(self.popularity)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.popularity[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- routing ---------------------------------------------------------------------------
    def pick(self, req: Req, now: float) -> SimNode:
        nodes = self.snapshot.nodes
        policy = self.policy
        if policy == "random":
            return self.nodes[self.route_rng.randrange(len(self.nodes))]
        if policy == "round-robin":
            return self.nodes[next(self.turn) % len(self.nodes)]
        if policy == "least-load":
            local = [n for n in nodes if n.region == req.region]
            best = min(load_score(n.load, DEFAULT_PARAMS) for n in local)
            ties = [n for n in local if load_score(n.load, DEFAULT_PARAMS) == best]
            return self.by_id[self.route_rng.choice(ties).node_id]
        key = f"system:tenant {req.tenant}"
        # CPU time of this thread: the decision's own cost, not the machine's other load.
        start = time.thread_time()
        if policy == "bands":
            local = [n for n in nodes if n.region == req.region and not is_saturated(n.load, DEFAULT_PARAMS)]
            pool = local or list(nodes)
            rank = {i: r for r, i in enumerate(rendezvous_rank(key, [n.node_id for n in pool]))}
            chosen = min(pool, key=lambda n: (load_band(n.load, DEFAULT_PARAMS), rank[n.node_id])).node_id
        else:
            request = RouteRequest(
                MODEL,
                home_region=req.region,
                affinity_key=key,
                conversation=req.conversation,
                prompt_tokens=req.tokens[-1],
            )
            overlay = policy == "cost"
            decision = route(
                request, POLICY, self.overlaid(now) if overlay else self.snapshot, params=self.params
            )
            chosen = decision.targets[0].target_id
            if overlay and decision.prefill is not None:
                self.routed.note(chosen, decision.prefill, now, key=str(req.rid))
        self.decision_s.append(time.thread_time() - start)
        return self.by_id[chosen]

    def overlaid(self, now: float) -> FleetSnapshot:
        """The snapshot with the overlay, as the gateway's prober hands it to routing: each
        node's requests routed in the last OVERLAY_KEPT_S (part of the decision's cost)."""
        nodes = []
        for n in self.snapshot.nodes:
            overlay = self.routed.sums(n.node_id, now, n.load.asked_at) if n.load is not None else None
            if overlay is not None and n.load is not None:
                last = self._with_overlay.get(n.node_id)
                if last is None or last[0] is not n or last[1] is not overlay:
                    last = (n, overlay, dataclasses.replace(n, load=n.load.with_overlay(overlay)))
                    self._with_overlay[n.node_id] = last
                n = last[2]
            nodes.append(n)
        return FleetSnapshot(nodes=tuple(nodes), providers=self.snapshot.providers)

    # -- node ------------------------------------------------------------------------------
    def arrive(self, t: float, req: Req) -> None:
        node = self.pick(req, t)
        req.node = node.index
        names = prefix_names(MODEL, None, req.conversation)
        req.cached = min(node.lookup(names), req.tokens[-1] - 1)
        # Recorded at arrival, as the real node publishes a prefix while its request computes it.
        node.insert(names, req.tokens)
        node.waiting_tokens += req.tokens[-1] - req.cached
        if node.running < node.max_num_seqs:
            node.running += 1
            self.start_prefill(t, node, req)
        else:
            node.slot_wait.append(req)

    def start_prefill(self, t: float, node: SimNode, req: Req) -> None:
        uncached = req.tokens[-1] - req.cached
        if 0 < uncached <= node.threshold:
            # Beside the long prompt in progress, if any: one step with that prompt's chunk.
            req.long = False
            beside = node.threshold if node.prefill_busy else 0
            self.push(t + node.step.step_s(uncached + beside), "prefilled", req)
            return
        node.prefill.append(req)
        if not node.prefill_busy:
            self.next_prefill(t, node)

    def next_prefill(self, t: float, node: SimNode) -> None:
        if not node.prefill:
            node.prefill_busy = False
            return
        node.prefill_busy = True
        req = node.prefill[0]
        uncached = req.tokens[-1] - req.cached
        self.push(t + node.step.step_s(uncached), "prefilled", req)

    def prefilled(self, t: float, req: Req) -> None:
        node = self.nodes[req.node]
        node.waiting_tokens -= req.tokens[-1] - req.cached
        req.first_token = t
        # The gateway hears the first token: the request runs there, it no longer waits.
        self.routed.moved(node.info.node_id, str(req.rid), "running")
        tpot = node.step.base_s + node.step.per_token_s * node.running
        self.push(t + req.output * tpot, "finished", req)
        if req.long:
            node.prefill.popleft()
            self.next_prefill(t, node)

    def finished(self, t: float, req: Req) -> None:
        node = self.nodes[req.node]
        node.finished.append(t)
        self.routed.moved(node.info.node_id, str(req.rid), "done")  # its stream ended
        self.done.append(req)
        if node.slot_wait:
            self.start_prefill(t, node, node.slot_wait.popleft())
        else:
            node.running -= 1
        if req.chat is not None and req.chat[1] > 0:
            answer, user = self.rng.randint(32, 256), self.rng.randint(20, 120)
            chat_id, left = req.chat
            turn = len(req.conversation)
            conversation = (
                *req.conversation,
                ("assistant", text(f"a {chat_id}/{turn}", answer)),
                ("user", text(f"u {chat_id}/{turn}", user)),
            )
            tokens = [*req.tokens, req.tokens[-1] + answer, req.tokens[-1] + answer + user]
            follow = Req(
                next(self.request_ids),
                req.tenant,
                req.region,
                conversation,
                tokens,
                self.rng.randint(32, 256),
                t + self.rng.expovariate(1 / 20.0),
                (chat_id, left - 1),
            )
            self.push(follow.arrival, "arrive", follow)

    def probe(self, t: float) -> None:
        self.snapshot = FleetSnapshot(
            nodes=tuple(NodeInfo(**{**vars(n.info), "load": n.report(t)}) for n in self.nodes)
        )

    # -- run -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        a = self.args
        t = 0.0
        while t < a.day_s:  # arrivals: a non-homogeneous Poisson process, by thinning
            t += self.rng.expovariate(20 * a.trough + a.peak)
            if self.rng.random() < self.rate(t) / (20 * a.trough + a.peak):
                self.push(t, "arrive", None)
        probe = 0.0
        while probe < a.day_s + 120:
            self.push(probe, "probe")
            probe += a.probe_s
        handlers = {
            "prefilled": self.prefilled,
            "finished": self.finished,
            "probe": lambda t, _: self.probe(t),
        }
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            if kind == "arrive":
                self.arrive(now, payload if payload is not None else self.new_session(now))
            else:
                handlers[kind](now, payload)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        a = self.args
        spike_at = 0.6 * a.day_s
        ttft = sorted(r.first_token - r.arrival for r in self.done if r.first_token is not None)
        spike = sorted(
            r.first_token - r.arrival
            for r in self.done
            if r.first_token is not None and spike_at <= r.arrival < spike_at + a.spike_s
        )
        per_node = [0] * len(self.nodes)
        for r in self.done:
            per_node[r.node] += 1
        prompt = sum(r.tokens[-1] for r in self.done)
        decision = sorted(self.decision_s)
        return {
            "requests": len(self.done),
            "ttft_p50_s": _q(ttft, 0.5),
            "ttft_p90_s": _q(ttft, 0.9),
            "ttft_p99_s": _q(ttft, 0.99),
            "spike_requests": len(spike),
            "spike_ttft_p50_s": _q(spike, 0.5),
            "spike_ttft_p90_s": _q(spike, 0.9),
            "hit_rate": round(sum(r.cached for r in self.done) / prompt, 3) if prompt else 0.0,
            "busiest_node_share": round(max(per_node) / max(len(self.done), 1), 4),
            "decision_ms_p50": round(_q(decision, 0.5) * 1000, 3) if decision else None,
            "decision_ms_p99": round(_q(decision, 0.99) * 1000, 3) if decision else None,
        }


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return round(values[min(int(q * len(values)), len(values) - 1)], 4)


def calibration(path: Path | None) -> StepCost:
    if path is None or not path.exists():
        return DEFAULT_STEP
    costs = json.loads(path.read_text()).get("step_costs") or []
    if not costs:
        return DEFAULT_STEP
    costs.sort(key=lambda c: c["per_token_s"])
    mid = costs[len(costs) // 2]
    return StepCost(base_s=mid["base_s"], per_token_s=mid["per_token_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter day (for a smoke run)")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--day-s", type=float, default=600.0)
    parser.add_argument("--trough", type=float, default=2.0, help="requests/s at night")
    parser.add_argument("--peak", type=float, default=12.0, help="requests/s at the day's peak")
    parser.add_argument("--spike-s", type=float, default=15.0)
    parser.add_argument("--probe-s", type=float, default=0.25)
    parser.add_argument("--max-num-seqs", type=int, default=64)  # the nodes' default
    parser.add_argument("--kv-tokens", type=int, default=65_536)
    parser.add_argument(
        "--threshold", type=int, default=256, help="the nodes' long_prefill_token_threshold (0: off)"
    )
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--calibration", type=Path, default=None)
    parser.add_argument(
        "--params", nargs="*", default=[], metavar="NAME=VALUE", help="RoutingParams for the cost policies"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "fleet_routing" / "fleet_sim.json"
    )
    args = parser.parse_args(argv)
    args.params = {k: float(v) for k, v in (p.split("=", 1) for p in args.params)}
    if args.quick:
        args.day_s, args.spike_s = 120.0, 5.0
    step = calibration(args.calibration)
    results = {}
    for policy in args.policies:
        start = time.perf_counter()
        results[policy] = Sim(args, policy, step).run()
        results[policy]["sim_wall_s"] = round(time.perf_counter() - start, 1)
        print(policy, json.dumps(results[policy]), flush=True)
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "step_cost": {"base_s": step.base_s, "per_token_s": step.per_token_s},
        "policies": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(
        "| policy | TTFT p50 s | p90 s | p99 s | spike p90 s | hit rate | busiest node | decision p50/p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for policy, r in results.items():
        print(
            f"| {policy} | {r['ttft_p50_s']} | {r['ttft_p90_s']} | {r['ttft_p99_s']} | {r['spike_ttft_p90_s']} | "
            f"{r['hit_rate']} | {r['busiest_node_share']} | {r['decision_ms_p50']}/{r['decision_ms_p99']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

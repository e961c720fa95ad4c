"""A node's cost for one request: its estimated time to the request's first token there.

    cost = queue wait + the prompt tokens the node does not hold cached, prefilled at its rate

- queue wait: the first-token estimate admission uses (router/overload.py over
  protocol/first_token.py: a free slot, the prompts queued ahead, the step in progress);
- cached tokens: the longest message prefix of the request (protocol/prefix_cache.py names)
  that the node's published table holds;
- prefill: the uncached tokens through the same estimate, at the node's fitted step cost
  (`per_token_s` is its measured prefill rate). A node that has not measured its step cost
  prefills at the median rate of the nodes that have, else at `RoutingParams.prefill_s_per_token`.

So a cached prefix wins exactly while the prefill it saves is worth more than the extra queue
it waits behind: a hot prefix's node, once its queue costs more than a cold prefill elsewhere,
sends the overflow to a second node, whose table then holds the prefix too. (On a node with
partial prefills a warm request waits behind no queued prompt, so what sends it elsewhere is a
node out of sequence slots, or decodes slowing every step.)

Two corrections keep the comparison fair (issue 35's cold prefills, benchmarks/fleet_routing.py):

- **One unit for tokens.** A node's queue is reported in its own tokens, the request only as the
  gateway's estimate (bytes / 4 here; a small tokenizer makes twice that). Comparing a cached
  node's reported queue with an estimated cold prefill elsewhere would make the cold prefill
  look cheaper than it is, and send a tenant's next request to prefill its prompt again. Where a
  node publishes one of the request's prefixes, its tokens are the node's own count: the
  request's size is taken as that prefix's published tokens plus the estimate of the rest
  (`Demand.sized`), on every node alike.
- **The gateway's overlay** (`NodeLoad.overlay`, kept by gateway/health/probes.py): the requests
  this gateway sent to a node that the node's last report was asked too early to show. Each is
  put in the node's queue (its uncached tokens), as admission puts its pending requests, so a
  burst inside one probe interval does not pile onto the node that looked cheapest; and each
  one's prefixes count as cached there: the request following a tenant's first one queues behind
  that prefill on its node, rather than prefilling the same prompt cold on another. Once the node
  answers a request (its first token), the gateway knows its prompt is computed: it leaves the
  queue for the node's running sequences until its answer ends, and its prefixes are ready.
  Without that, a node that had just answered looked busy with a prompt it had already computed
  until its next report. The published tables stay the source: the overlay only covers the gap
  until they show a request, and a replica that did not route it simply goes without.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol.prefix_cache import prefix_names
from router.overload import QueueAhead, queue_ahead
from router.params import RoutingParams
from router.types import ModelQueue, NodeInfo, NodeLoad, Overlaid, Prefill, Routed, TenantPolicy, TrafficTier


@dataclass(frozen=True)
class Demand:
    """What one request asks of a node, as its cost needs it."""

    tier: TrafficTier = "interactive"
    prompt_tokens: int = 1
    conversation: tuple[tuple[str, str], ...] = ()
    salt: str | None = None  # the node's cache salt for this tenant (isolated tenants)
    # The capabilities it asks for (protocol/capabilities.py): only nodes serving them all are
    # its pool.
    needs: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls,
        policy: TenantPolicy,
        prompt_tokens: int,
        conversation: tuple[tuple[str, str], ...],
        needs: frozenset[str] = frozenset(),
    ) -> Demand:
        """A tenant's request: `prompt_tokens` is the gateway's estimate (<= 0: 4 bytes a token
        and 4 per message, the gateway's own rule)."""
        if prompt_tokens <= 0:
            prompt_tokens = sum(len(text.encode()) // 4 + 4 for _, text in conversation)
        return cls(
            tier=policy.traffic_tier,
            prompt_tokens=max(prompt_tokens, 1),
            conversation=conversation,
            # The node salts an isolated tenant's cache with its id (the gateway's cache-salt header).
            salt=policy.tenant_id if policy.prefix_cache == "isolated" else None,
            needs=needs,
        )

    def names(self, model: str) -> tuple[str, ...]:
        return _prefix_names(model, self.salt, self.conversation) if self.conversation else ()

    def prefix_tokens(self) -> tuple[int, ...]:
        """The estimated tokens of each message prefix: the prompt's estimate shared out by the
        messages' bytes (plus a message's framing, ~4 tokens), so the last is the whole prompt."""
        sizes = [len(text.encode("utf-8", "surrogatepass")) + 16 for _, text in self.conversation]
        total = sum(sizes) or 1
        running, out = 0, []
        for size in sizes:
            running += size
            out.append(max(round(self.prompt_tokens * running / total), 1))
        return tuple(out)

    def anchor(self, model: str) -> str:
        """The prefix key equal-cost nodes are ranked by (rendezvous): the name of the shortest
        message prefix holding at least half the prompt (a tenant's system prompt; a chat's
        opening), so the requests that share most of their prompt rank nodes alike on every
        replica, whatever their last turn. "" without a conversation."""
        names = self.names(model)
        if not names:
            return ""
        half = self.prompt_tokens / 2
        return next((n for n, t in zip(names, self.prefix_tokens(), strict=True) if t >= half), names[-1])


@functools.lru_cache(maxsize=64)
def _prefix_names(model: str, salt: str | None, conversation: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """`prefix_names`, hashed once per request: admission, sizing and the anchor each ask for a
    request's names (BLAKE2b over every message, ~10 µs a time). Only recent conversations are
    kept, so their texts are held briefly."""
    return prefix_names(model, salt, conversation)


@dataclass(frozen=True)
class Sized:
    """A request's prefixes and size for one decision, in the nodes' tokens where any node says."""

    names: tuple[str, ...]
    prefix_tokens: tuple[int, ...]  # the gateway's estimate of each prefix
    prompt_tokens: int  # the request's size: published prefix + estimated rest, else the estimate

    def cached(self, load: NodeLoad | None) -> int:
        """The tokens of the request the node holds or will hold: its published table, else a
        request of this gateway's overlay that computes one of the prefixes."""
        return self.held(load)[0]

    def held(self, load: NodeLoad | None) -> tuple[int, bool]:
        """`cached`, and whether those tokens are in the node's cache now. They are not when the
        node says a request is still computing that prefix, or when only this gateway's overlay
        knows of it (a request it sent, which the node's table does not show yet) and the node
        has not answered that request: the request then waits for that prefill before it can
        start short."""
        if load is None or not self.names:
            return 0, True
        k, published = _longest(load.cached_prefixes, self.names)
        ready = published == 0 or self.names[k] not in load.computing_prefixes
        if load.overlay is None or not load.overlay.prefixes:
            return published, ready
        # Within one routed request a longer prefix covers more tokens, so the most any of this
        # request's names gets in the overlay is what its longest held prefix gets. Compared by
        # position, not tokens: the overlay counts in the gateway's estimate, the table in the
        # node's tokens.
        routed = _longest(load.overlay.prefixes, self.names)
        if routed[0] > k:
            tokens = max(published, *(load.overlay.prefixes.get(name, 0) for name in self.names))
            # Ready once the node has answered a request that named it: its prompt is computed.
            return tokens, self.names[routed[0]] in load.overlay.prefilled
        return published, ready

    def prefill(self, load: NodeLoad | None) -> Prefill:
        """What the node computes if the request goes there (the gateway's overlay keeps it)."""
        cached = self.cached(load)
        # Prefix k's size in this request's units: scaled to the size the nodes' counts give.
        scale = self.prompt_tokens / self.prefix_tokens[-1] if self.prefix_tokens else 1.0
        prefixes = {n: round(t * scale) for n, t in zip(self.names, self.prefix_tokens, strict=True)}
        return Prefill(prefixes=prefixes, uncached_tokens=max(self.prompt_tokens - cached, 1))


def sized(demand: Demand, model: str, loads: Sequence[NodeLoad | None]) -> Sized:
    """The request's size in the nodes' tokens (module docstring): the longest of its prefixes
    any node publishes, at that node's count, plus the estimate of the messages after it."""
    names = demand.names(model)
    estimate = demand.prompt_tokens
    if not names:
        return Sized((), (), estimate)
    tokens = demand.prefix_tokens()
    size = estimate
    for load in loads:
        if load is None or not load.cached_prefixes:
            continue
        k, held = _longest(load.cached_prefixes, names)
        if held:
            size = max(size, held + estimate - tokens[k])
    return Sized(names, tokens, size)


@dataclass(frozen=True)
class Held:
    """What admission's estimate (router.overload.pool_wait) needs to count only the prompt each
    node would compute: the request's size in the nodes' tokens (`sized`), per node holding part
    of it the tokens it holds, and the nodes where that part is still being computed."""

    prompt_tokens: int
    cached: Mapping[str, int]
    not_ready: frozenset[str]


def held(demand: Demand, model: str, nodes: Sequence[NodeInfo]) -> Held:
    size = sized(demand, model, [n.load for n in nodes])
    if not size.names:
        return Held(size.prompt_tokens, {}, frozenset())
    cached: dict[str, int] = {}
    not_ready: set[str] = set()
    for n in nodes:
        tokens, ready = size.held(n.load)
        if tokens:
            cached[n.node_id] = tokens
            if not ready:
                not_ready.add(n.node_id)
    return Held(size.prompt_tokens, cached, frozenset(not_ready))


def overlaid(routed: Sequence[Routed], asked_at: float) -> Overlaid:
    """What routing reads of a node's overlay (`Overlaid`), from its requests (oldest first)
    and when the node's report was asked. The gateway keeps these sums as it notes requests
    and hears their answers (gateway/health/probes.py); this is what they must equal."""
    prefixes: dict[str, int] = {}
    prefilled: set[str] = set()
    unreported = tokens = running = 0
    for r in routed:
        for name, held in r.prefill.prefixes.items():
            if held > prefixes.get(name, 0):
                prefixes[name] = held
        if r.stage != "waiting":
            prefilled.update(r.prefill.prefixes)
        if r.routed_at < asked_at:
            continue  # the report shows it
        if r.stage == "waiting":
            unreported += 1
            tokens += r.prefill.uncached_tokens
        elif r.stage == "running":
            running += 1
    return Overlaid(prefixes, unreported, tokens, running, frozenset(prefilled))


def _longest(entries: Mapping[str, int], names: Sequence[str]) -> tuple[int, int]:
    """(index, tokens) of the longest named prefix the table holds; (-1, 0) for none."""
    for k in range(len(names) - 1, -1, -1):
        held = entries.get(names[k])
        if held is not None:
            return k, held
    return -1, 0


@dataclass(frozen=True)
class NodeCost:
    cached_tokens: int
    wait_s: float  # math.inf: the node's queue for the tier is at its bound
    prefill_s: float
    routed: int = 0  # requests of the gateway's overlay counted in `wait_s`, waiting
    ahead: int = 0  # requests queued in front of it: reported waiting plus `routed`
    running: int = 0  # requests of the overlay counted as running sequences (answered since)

    @property
    def total_s(self) -> float:
        return self.wait_s + self.prefill_s

    def describe(self) -> str:
        """The cost parts for the route header: `cost=0.142;cached=768;wait=0.020`, then what
        the gateway's overlay added: `;routed=2` waiting, `;running=1` answered since the report."""
        text = f"cost={self.total_s:.3f};cached={self.cached_tokens};wait={self.wait_s:.3f}"
        if self.routed:
            text += f";routed={self.routed}"
        return text + f";running={self.running}" if self.running else text


def fallback_prefill_s(nodes: Sequence[NodeInfo], model: str, params: RoutingParams) -> float:
    """Seconds per prompt token for a node that has not measured its own: the median of those
    that have (nodes of one model run alike), else the parameter."""
    rates = [
        q.step_cost.per_token_s
        for n in nodes
        if n.load is not None and (q := n.load.models.get(model)) is not None and q.step_cost.per_token_s > 0
    ]
    return statistics.median(rates) if rates else params.prefill_s_per_token


def node_cost(
    node: NodeInfo,
    *,
    model: str,
    tier: TrafficTier,
    request: Sized,
    fallback_s_per_token: float,
) -> NodeCost:
    load = node.load
    cached, ready = request.held(load)
    # The node's block rounding can make a cached prefix cover more than the request's size.
    uncached = max(request.prompt_tokens - cached, 1)
    queue = load.models.get(model) if load is not None else None
    # The overlay's requests that the report cannot show (asked before they were sent): those
    # waiting for their first token, and those answered and still generating.
    routed = routed_tokens = running = 0
    if load is not None and load.overlay is not None:
        overlay = load.overlay
        routed, routed_tokens, running = (
            overlay.unreported,
            overlay.unreported_tokens,
            overlay.unreported_running,
        )
    ahead = queue_ahead(queue, tier, requests=routed, tokens=routed_tokens, running=running)
    wait = _wait_s(queue, tier, ahead, overlaid=routed > 0 or running > 0)
    waiting = routed + (sum(queue.waiting_requests_by_tier.values()) if queue is not None else 0)
    if math.isinf(wait):
        return NodeCost(cached, math.inf, 0.0, routed, waiting, running)
    if queue is not None and queue.step_cost.measured:
        prefill = max(ahead.estimate(uncached, behind=not ready) - wait, 0.0)
    else:
        prefill = uncached * fallback_s_per_token
        # Without a fitted step the estimate cannot place the overlay's requests: they prefill
        # at the same rate ahead of this one.
        wait += routed_tokens * fallback_s_per_token
    return NodeCost(cached, wait, prefill, routed, waiting, running)


def _wait_s(queue: ModelQueue | None, tier: TrafficTier, ahead: QueueAhead, *, overlaid: bool) -> float:
    """The queue part of the estimate (the estimate for a one-token prompt), once per report
    when the overlay adds nothing."""
    if queue is None or overlaid:
        return ahead.estimate(1)
    key = ("wait", tier)
    wait = queue.derived.get(key)
    if wait is None:
        wait = queue.derived[key] = ahead.estimate(1)
    return wait


def cost_band(cost: NodeCost, params: RoutingParams) -> float:
    """Costs in one band are equal. Bands grow geometrically by `cost_ratio` from
    `cost_quantum_s` (every cost below it is band 0): each node fits its own step cost on its
    own recent steps, and identical nodes' fits differ by tens of percent on a busy machine, so a
    fixed width would send every new prompt to whichever node's fit is luckiest."""
    total = cost.total_s
    if math.isinf(total):
        return math.inf
    if total <= params.cost_quantum_s:
        return 0
    return 1 + math.floor(math.log(total / params.cost_quantum_s) / math.log(params.cost_ratio))

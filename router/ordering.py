"""The order in which admitted nodes are tried, and the reason each gets its place.

Nodes are sorted by the tuple

    (saturated, preference class, cost band, -cached tokens, load band, affinity rank, node id)

- saturated: a node known to be full sinks below every unsaturated node, whatever its region.
- preference class: 0 = in the preferred region (the client's, else the gateway's home region),
  1 = in the preferred region's jurisdiction, 2 = anywhere else the tenant's residency allows.
- cost band: 0 within `cost_ratio` of the cheapest node's estimated time to first token
  (router/cost.py: queue wait plus the prefill of the prompt tokens the node does not hold
  cached), or within `holder_ratio` for a node holding at least half the prompt (the hysteresis
  before a prompt is prefilled on a second node); beyond, geometric bands. Only the first
  (saturated, preference class) group is costed, the one the request goes to; the groups after
  it are failover and rank by load band and affinity alone (their reasons carry no cost), which
  keeps a decision at 64 nodes in four regions to a quarter of the per-node estimates.
- cached tokens: among equal costs, the node that computes less of the prompt.
- requests ahead: for a prompt mostly uncached there, the node with fewer requests queued (its
  prefill would hold each of them up).
- load band: floor(load score / band width); a node that has not reported its load gets the
  neutral score.
- affinity rank: position in the rendezvous ranking over the admitted nodes of the request's
  anchor prefix (router.cost.Demand.anchor; the affinity key for a completion prompt), so every
  request sharing most of its prompt breaks ties alike, on every replica.
- node id: unreachable in practice (ranks are distinct); it keeps the sort total.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from router.affinity import rendezvous_weight
from router.cost import Demand, NodeCost, Sized, cost_band, fallback_prefill_s, node_cost, sized
from router.load import load_facts
from router.params import RoutingParams
from router.rollout import node_version
from router.types import NodeInfo, ProviderInfo, Target

PREFERENCE_WORDS = ("same-region", "same-jurisdiction", "other-region")


def preferred_jurisdiction(region: str, places: Iterable[NodeInfo | ProviderInfo]) -> str | None:
    """The jurisdiction of `region` as the fleet knows it (from any node or provider there, healthy
    or not); None when the fleet has nothing in that region."""
    for place in places:
        if place.region == region:
            return place.jurisdiction
    return None


def preference_class(
    region: str, jurisdiction: str, *, preferred_region: str, preferred_jurisdiction: str | None
) -> int:
    if region == preferred_region:
        return 0
    if preferred_jurisdiction is not None and jurisdiction == preferred_jurisdiction:
        return 1
    return 2


def order_nodes(
    nodes: Sequence[NodeInfo],
    *,
    model: str,
    preferred_region: str,
    preferred_jurisdiction: str | None,
    affinity_key: str,
    params: RoutingParams,
    demand: Demand = Demand(),
    size: Sized | None = None,
    reason_prefix: str = "",
) -> tuple[Target, ...]:
    """`nodes` as Targets for `model`, in the documented order, each with its reason. `size`:
    the demand already sized over these nodes (router.cost.sized), else it is sized here.

    This runs on every request over every admitted node (64 and more), so each node's facts are
    computed once, and rendezvous weights (a hash each) only for nodes that tie on the rest."""
    if size is None:
        size = sized(demand, model, [n.load for n in nodes])
    # Equal costs rank by the prefix most of the prompt shares (router.cost.Demand.anchor): the
    # same for every request of a tenant's system prompt or a chat's opening, on every replica.
    affinity_key = demand.anchor(model) or affinity_key
    measured = all(_measured(n, model) for n in nodes)
    fallback = params.prefill_s_per_token if measured else fallback_prefill_s(nodes, model, params)
    loads = [load_facts(n.load, params) for n in nodes]
    prefs = [
        preference_class(
            n.region,
            n.jurisdiction,
            preferred_region=preferred_region,
            preferred_jurisdiction=preferred_jurisdiction,
        )
        for n in nodes
    ]
    # Only the first (saturated, preference class) group is costed: the request goes there, and
    # the groups after it are failover, ordered by load band and affinity alone. At 64 nodes in
    # four regions that is a quarter of the per-node estimates, the bulk of a decision's cost.
    first = min(zip((facts[0] for facts in loads), prefs, strict=True), default=(False, 0))
    costs = [
        node_cost(n, model=model, tier=demand.tier, request=size, fallback_s_per_token=fallback)
        if (facts[0], pref) == first
        else None
        for n, facts, pref in zip(nodes, loads, prefs, strict=True)
    ]
    # Equal to the cheapest: within cost_ratio of it (or one quantum). Relative to the cheapest
    # rather than fixed bands alone, so the first choice never hinges on a band boundary.
    best = min((c.total_s for c in costs if c is not None), default=0.0)
    near = max(best * params.cost_ratio, best + params.cost_quantum_s)
    # A node holding most of the prompt counts as equal further out (holder_ratio): its queue is
    # estimated as if the step in progress had just begun, and leaving it prefills the prompt a
    # second time, which every request queued behind that prefill waits for too.
    near_holder = max(best * params.holder_ratio, near)
    held = size.prompt_tokens / 2
    facts: dict[str, tuple[tuple[bool, int, float, int, int, int], NodeCost | None, str]] = {}
    for n, cost, (saturated, band, load_text), pref in zip(nodes, costs, loads, prefs, strict=True):
        if cost is None:
            facts[n.node_id] = ((saturated, pref, 0, 0, 0, band), None, load_text)
            continue
        limit = near_holder if cost.cached_tokens >= held else near
        band_of_cost = 0 if cost.total_s <= limit else 1 + cost_band(cost, params)
        # Among equal costs, the node with more of the prompt cached: the same first token for
        # less of the fleet's prefill time, and one copy of a prompt instead of two.
        # Then, when the prompt is mostly uncached here, the node with fewer requests queued:
        # its long prefill would hold up each of them (they share its engine steps), which its
        # own cost does not count (queue_ahead_tiebreak; 0 disables).
        cold = params.queue_ahead_tiebreak and cost.cached_tokens < held
        group = (saturated, pref, band_of_cost, -cost.cached_tokens, cost.ahead if cold else 0, band)
        facts[n.node_id] = (group, cost, load_text)
    ordered = sorted(nodes, key=lambda n: (facts[n.node_id][0], n.node_id))
    # Among nodes of one group, the rendezvous order of the affinity key (ids are distinct).
    runs = [list(run) for _, run in itertools.groupby(ordered, key=lambda n: facts[n.node_id][0])]
    targets: list[Target] = []
    for run in runs:
        if len(run) > 1:
            run.sort(key=lambda n: (-rendezvous_weight(affinity_key, n.node_id), n.node_id))
        for place, node in enumerate(run, start=1):
            group, cost, load_text = facts[node.node_id]
            parts = [f"region={node.region}", PREFERENCE_WORDS[group[1]], load_text]
            if cost is not None:
                parts.append(cost.describe())
            if len(run) > 1:
                # Affinity decided this node's place among equal ones: say where it came.
                parts.append(f"affinity={place}/{len(run)}")
            targets.append(
                Target(
                    kind="node",
                    target_id=node.node_id,
                    url=node.url,
                    region=node.region,
                    jurisdiction=node.jurisdiction,
                    model=model,
                    reason=reason_prefix + ";".join(parts),
                    version=served.version if (served := node_version(node, model)) is not None else "",
                )
            )
    return tuple(targets)


def _measured(node: NodeInfo, model: str) -> bool:
    queue = node.load.models.get(model) if node.load is not None else None
    return queue is not None and queue.step_cost.measured


def order_providers(
    providers: Sequence[ProviderInfo],
    *,
    model: str,
    preferred_region: str,
    preferred_jurisdiction: str | None,
) -> tuple[Target, ...]:
    """Providers by preference class, then id: they carry no load report and no prefix cache."""

    def key(p: ProviderInfo) -> tuple[int, str]:
        pref = preference_class(
            p.region,
            p.jurisdiction,
            preferred_region=preferred_region,
            preferred_jurisdiction=preferred_jurisdiction,
        )
        return (pref, p.provider_id)

    return tuple(
        Target(
            kind="provider",
            target_id=p.provider_id,
            # Providers are reached through their adapter (looked up by target_id), not a URL.
            url="",
            region=p.region,
            jurisdiction=p.jurisdiction,
            model=model,
            reason=f"provider={p.kind};region={p.region};{PREFERENCE_WORDS[key(p)[0]]}",
        )
        for p in sorted(providers, key=key)
    )

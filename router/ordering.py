"""The order in which admitted nodes are tried, and the reason each gets its place.

Nodes are sorted by the tuple

    (saturated, preference class, cost band, load band, affinity rank, node id)

- saturated: a node known to be full sinks below every unsaturated node, whatever its region.
- preference class: 0 = in the preferred region (the client's, else the gateway's home region),
  1 = in the preferred region's jurisdiction, 2 = anywhere else the tenant's residency allows.
- cost band: floor(estimated time to first token / cost quantum), router/cost.py: queue wait
  plus the prefill of the prompt tokens the node does not hold cached.
- load band: floor(load score / band width), among equal costs; a node that has not reported its
  load gets the neutral score.
- affinity rank: position in the rendezvous ranking of the affinity key over the admitted nodes,
  so affinity only breaks ties among nodes of equal cost and similar load in the same class.
- node id: unreachable in practice (ranks are distinct); it keeps the sort total.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from router.affinity import rendezvous_rank
from router.cost import Demand, cost_band, fallback_prefill_s, node_cost
from router.load import describe_load, is_saturated, load_band
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
    reason_prefix: str = "",
) -> tuple[Target, ...]:
    """`nodes` as Targets for `model`, in the documented order, each with its reason."""
    names = demand.names(model)
    fallback = fallback_prefill_s(nodes, model, params)
    costs = {
        n.node_id: node_cost(
            n,
            model=model,
            tier=demand.tier,
            prompt_tokens=demand.prompt_tokens,
            names=names,
            fallback_s_per_token=fallback,
        )
        for n in nodes
    }
    # One node needs no ranking (the common case of a small region, and this runs per request).
    ranked = (
        rendezvous_rank(affinity_key, (n.node_id for n in nodes))
        if len(nodes) > 1
        else [n.node_id for n in nodes]
    )
    affinity = {node_id: rank for rank, node_id in enumerate(ranked)}

    def group(node: NodeInfo) -> tuple[bool, int, float, int]:
        pref = preference_class(
            node.region,
            node.jurisdiction,
            preferred_region=preferred_region,
            preferred_jurisdiction=preferred_jurisdiction,
        )
        band = cost_band(costs[node.node_id], params)
        return (is_saturated(node.load, params), pref, band, load_band(node.load, params))

    # Once per node: this runs on every request.
    groups = {n.node_id: group(n) for n in nodes}
    ordered = sorted(nodes, key=lambda n: (*groups[n.node_id], affinity[n.node_id], n.node_id))
    group_sizes = Counter(groups.values())
    targets: list[Target] = []
    place_in_group: Counter[tuple[bool, int, float, int]] = Counter()
    for node in ordered:
        g = groups[node.node_id]
        place_in_group[g] += 1
        parts = [
            f"region={node.region}",
            PREFERENCE_WORDS[g[1]],
            describe_load(node.load, params),
            costs[node.node_id].describe(),
        ]
        if group_sizes[g] > 1:
            # Affinity decided this node's place among similar ones: say where it came.
            parts.append(f"affinity={place_in_group[g]}/{group_sizes[g]}")
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

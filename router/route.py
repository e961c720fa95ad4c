"""`route`: from a request, a tenant's policy and a fleet snapshot to an ordered list of targets.

Pure: the same inputs always give the same decision, so a trace can show and replay it.
Order of the result: the model's nodes (see router.ordering), then — when the model has no
unsaturated node and the policy allows it — small-tier nodes marked "degraded", then commercial
providers when the policy allows them. A request admission already degraded (`degraded_from`: its
pool was over its tier's target, gateway/admission) is routed to the small model it names, every
target marked "degraded". Every target on every list is inside the tenant's residency
(router.candidates screens before anything else looks).

Versions (router.rollout): a model with a rollout plan is served only by nodes advertising the
version the request's sticky key draws, and never by a provider (whose version is unknown); a
request pinned to a version (a stream continuation) only by targets of that version. No fallback
to another version: a session that moved versions mid-conversation, or a canary that silently
took the stable version's traffic, is what a rollout exists to prevent; the unavailable reason
names the version instead. A model without a plan is served by any version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.candidates import Screening, screen_nodes, screen_providers
from router.cost import Demand, Sized, sized
from router.load import is_saturated
from router.ordering import order_nodes, order_providers, preferred_jurisdiction
from router.params import DEFAULT_PARAMS, RoutingParams
from router.rollout import choose_version, node_version
from router.tiers import degrade_model
from router.types import (
    CatalogModel,
    FleetSnapshot,
    NodeInfo,
    Prefill,
    ProviderInfo,
    Rollout,
    RouteDecision,
    RouteRequest,
    Target,
    TenantPolicy,
)


def route(
    request: RouteRequest,
    policy: TenantPolicy,
    fleet: FleetSnapshot,
    *,
    catalog: Sequence[CatalogModel] = (),
    params: RoutingParams = DEFAULT_PARAMS,
    rollouts: Mapping[str, Rollout] | None = None,
) -> RouteDecision:
    """Ordered targets for `request.model` (already resolved from "auto").

    `catalog` is only needed for degrading (it says which model is the small tier); without it,
    no request is degraded. `rollouts`: the rollout plan of each model that has one. With no
    target at all, `targets` is empty and `unavailable_reason` says why in words a client can
    act on.
    """
    rollouts = rollouts or {}
    places = (*fleet.nodes, *fleet.providers)
    preferred_region = request.client_region or request.home_region
    jurisdiction = preferred_jurisdiction(preferred_region, places)
    if jurisdiction is None and preferred_region != request.home_region:
        # A client region the fleet has nothing in (a typo, or a region not served) says nothing
        # about distance; the request is at this gateway already, so its home region is preferred.
        preferred_region = request.home_region
        jurisdiction = preferred_jurisdiction(preferred_region, places)
    where = {"preferred_region": preferred_region, "preferred_jurisdiction": jurisdiction}
    affinity_key = _affinity_key(request, policy)
    screen = {"residency": policy.residency, "exclude": request.exclude, "needs": request.needs}
    sticky_key = request.session_key or affinity_key
    version = request.version
    if version is None and request.model in rollouts:
        version = choose_version(rollouts[request.model], sticky_key)

    nodes = screen_nodes(_of_version(fleet.nodes, request.model, version), model=request.model, **screen)
    demand = _demand(request, policy)
    size = sized(demand, request.model, [n.load for n in nodes.admitted])
    primary = order_nodes(
        nodes.admitted,
        model=request.model,
        affinity_key=affinity_key,
        params=params,
        demand=demand,
        size=size,
        reason_prefix=("degraded;" if request.degraded_from else "") + _probe_note(nodes),
        **where,
    )

    degraded: tuple[Target, ...] = ()
    small = degrade_model(request.model, policy, catalog)
    no_capacity = all(is_saturated(n.load, params) for n in nodes.admitted)
    small_nodes: Screening[NodeInfo] | None = None
    if small is not None and no_capacity:
        small_version = choose_version(rollouts[small.name], sticky_key) if small.name in rollouts else None
        small_nodes = screen_nodes(
            _of_version(fleet.nodes, small.name, small_version), model=small.name, **screen
        )
        # A node serving both tiers is already on the list (and saturated): trying it again
        # under another model name would only queue behind the same full cache.
        taken = {n.node_id for n in nodes.admitted}
        degraded = order_nodes(
            [n for n in small_nodes.admitted if n.node_id not in taken],
            model=small.name,
            affinity_key=affinity_key,
            params=params,
            demand=demand,
            reason_prefix="degraded;",
            **where,
        )

    # A provider's version is unknown: it serves only requests no version is asked of (or a
    # continuation of a stream that began on an unknown version).
    versionless = version is None or version == ""
    providers = screen_providers(fleet.providers if versionless else (), model=request.model, **screen)
    commercial = (
        order_providers(providers.admitted, model=request.model, **where) if policy.allow_commercial else ()
    )

    targets = primary + degraded + commercial
    if not targets:
        allowed = (nodes, small_nodes, providers if policy.allow_commercial else None)
        unsupported = _unsupported(request.needs, [s for s in allowed if s is not None])
        return RouteDecision(
            targets=(),
            reason=f"model={request.model}; no target"
            + (f" serves {', '.join(unsupported)}" if unsupported else ""),
            unavailable_reason=_unavailable_reason(
                _described(request.model, version),
                policy,
                nodes,
                providers,
                small,
                small_nodes,
                request.needs,
            ),
            version=version,
            unsupported=unsupported,
        )
    return RouteDecision(
        targets=targets,
        reason=_decision_reason(request, policy, preferred_region, primary, degraded, commercial, small)
        + (f"; version={version}" if version else ""),
        version=version,
        prefill=_prefill(targets[0], nodes.admitted, size),
    )


def _unsupported(
    needs: frozenset[str], screenings: Sequence[Screening[NodeInfo] | Screening[ProviderInfo]]
) -> tuple[str, ...]:
    """The capabilities in `needs` that no target the tenant may use serves, healthy or not;
    () when nothing inside its residency serves the model at all (that is no capability's fault)."""
    if not needs or not any(s.serving - s.outside_residency for s in screenings):
        return ()
    offered = frozenset().union(*(s.offered for s in screenings))
    return tuple(sorted(needs - offered))


def _prefill(first: Target, admitted: Sequence[NodeInfo], size: Sized) -> Prefill | None:
    """What the first target computes, for the gateway's overlay: a chat request to a node of
    the requested model (not a degraded one, whose model names other prefixes)."""
    if first.kind != "node" or not size.names:
        return None
    node = next((n for n in admitted if n.node_id == first.target_id), None)
    return size.prefill(node.load) if node is not None else None


def _probe_note(nodes: Screening[NodeInfo]) -> str:
    """Leads a target's reason when nodes were passed over for failing their golden probes."""
    return f"probe-failed={','.join(nodes.probe_failed)};" if nodes.probe_failed else ""


def _of_version(nodes: Sequence[NodeInfo], model: str, version: str | None) -> Sequence[NodeInfo]:
    """The fleet with the nodes serving `model` at another version (or an unknown one, when a
    version is asked for) left out; None asks for no version. "" asks for the unknown version."""
    if version is None:
        return nodes

    def keeps(node: NodeInfo) -> bool:
        if model not in node.models:
            return True
        served = node_version(node, model)
        return (served.version if served is not None else "") == version

    return [node for node in nodes if keeps(node)]


def _described(model: str, version: str | None) -> str:
    return f"version '{version}' of '{model}'" if version else f"'{model}'"


def _demand(request: RouteRequest, policy: TenantPolicy) -> Demand:
    return Demand.of(policy, request.prompt_tokens, request.conversation)


def _affinity_key(request: RouteRequest, policy: TenantPolicy) -> str:
    # An isolated tenant's prefix cache is salted on the node, so its prompts cannot hit another
    # tenant's blocks: give it its own affinity space instead of piling onto a shared prompt's node.
    if policy.prefix_cache == "isolated" and request.affinity_key:
        return f"{policy.tenant_id}\x00{request.affinity_key}"
    return request.affinity_key


def _decision_reason(
    request: RouteRequest,
    policy: TenantPolicy,
    preferred_region: str,
    primary: tuple[Target, ...],
    degraded: tuple[Target, ...],
    commercial: tuple[Target, ...],
    small: CatalogModel | None,
) -> str:
    model = request.model
    parts = [
        f"model={model}",
        *(
            [f"degraded from {request.degraded_from} (its pool is over the target)"]
            if request.degraded_from
            else []
        ),
        f"residency={policy.residency.describe()}",
        *([f"needs={','.join(sorted(request.needs))}"] if request.needs else []),
        f"preferred={preferred_region}",
        _count(len(primary), "node"),
    ]
    if degraded:
        assert small is not None
        parts.append(f"{len(degraded)} degraded to {small.name} (no unsaturated {model} node)")
    if commercial:
        parts.append(_count(len(commercial), "provider"))
    return "; ".join(parts)


def _unavailable_reason(
    model: str,  # as the reason names it: 'name', or version 'v' of 'name'
    policy: TenantPolicy,
    nodes: Screening[NodeInfo],
    providers: Screening[ProviderInfo],
    small: CatalogModel | None,
    small_nodes: Screening[NodeInfo] | None,
    needs: frozenset[str],
) -> str:
    where = policy.residency.describe()
    limited = where != "anywhere"
    where = f"in {where}" if limited else where
    asked = ", ".join(sorted(needs))
    if nodes.serving == 0:
        parts = [f"no node in the fleet serves {model}"]
    elif nodes.incapable and nodes.incapable == nodes.serving - nodes.outside_residency:
        # Every node it may use is up to it but for what it asks: that is the whole story.
        parts = [f"no node serving {model} {where} serves {asked}"]
        parts += _turned_away(nodes, "node", limited=limited, asked="")
    else:
        parts = [f"no healthy node serving {model} {where}"]
        parts += _turned_away(nodes, "node", limited=limited, asked=asked)
    if small is not None and small_nodes is not None:
        parts.append(f"degrading to '{small.name}' found no node for it {where} either")
    if providers.serving and not policy.allow_commercial:
        parts.append("commercial fallback is disabled for this tenant")
    elif providers.serving:
        parts += _turned_away(providers, "provider", limited=limited, asked=asked)
    return "; ".join(parts)


def _turned_away(
    screening: Screening[NodeInfo] | Screening[ProviderInfo], noun: str, *, limited: bool, asked: str
) -> list[str]:
    """What ruled out the targets serving the model; "inside it" (the residency) only for a tenant
    that has a residency limit. `asked`: the capabilities the request asks for, named ("": the
    targets without them go unmentioned)."""
    inside = " inside it" if limited else ""
    parts = []
    if screening.outside_residency:
        parts.append(
            f"{_count(screening.outside_residency, noun)} outside the tenant's residency "
            f"{_were(screening.outside_residency)} not considered"
        )
    if screening.incapable and asked:
        parts.append(f"{_count(screening.incapable, noun)}{inside} not serving {asked}")
    if screening.excluded:
        parts.append(f"{_count(screening.excluded, noun)} already tried for this request")
    if screening.unhealthy:
        parts.append(f"{_count(screening.unhealthy, noun)}{inside} {_were(screening.unhealthy)} unhealthy")
    probe_failed = screening.probe_failed
    if probe_failed:
        parts.append(
            f"{_count(len(probe_failed), noun)} failing golden-output probes for it ({', '.join(probe_failed)})"
        )
    return parts


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _were(n: int) -> str:
    return "was" if n == 1 else "were"

"""Capability routing: a request goes only to targets that serve everything it asks (tools,
structured output, ...), and a request nothing the tenant may use serves is told so, by name.

The invariants, over random fleets (nodes and providers each with random capabilities, health,
regions), tenants, residencies and asked capabilities:
- every target serves all the request asks, as well as being inside residency, healthy, serving
  the model and allowed (commercial);
- every such target that routing would take without the capability rule is still a target:
  capabilities only ever remove targets that would refuse the request;
- with no target, `unsupported` names exactly the asked capabilities that no target the tenant
  may use (healthy or not) serves; it is empty whenever one does, or when nothing inside the
  residency serves the model at all (then it is a plain "unavailable").
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.capabilities import ALL_CAPABILITIES, NODE_CAPABILITIES
from router import (
    FleetSnapshot,
    NodeInfo,
    NodeLoad,
    ProviderInfo,
    Residency,
    RouteRequest,
    TenantPolicy,
    route,
)
from router.overload import pool_wait
from router.tiers import degrade_model
from router.types import Target
from tests.router.builders import CATALOG, JURISDICTION_OF, LARGE, fleet, node, provider, tenant
from tests.router.test_residency import MODELS, REGIONS, residencies

CAPABILITIES = sorted(ALL_CAPABILITIES)
capability_sets = st.frozensets(st.sampled_from(CAPABILITIES))


def _placed(draw: st.DrawFn) -> dict[str, object]:
    region = draw(st.sampled_from(REGIONS))
    return {
        "region": region,
        "jurisdiction": JURISDICTION_OF[region],
        "models": frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2))),
        "healthy": draw(st.booleans()),
        "capabilities": draw(st.sampled_from([NODE_CAPABILITIES, ALL_CAPABILITIES]) | capability_sets),
    }


@st.composite
def fleets(draw: st.DrawFn) -> FleetSnapshot:
    node_ids = draw(st.lists(st.sampled_from([f"n{i}" for i in range(8)]), unique=True, max_size=6))
    provider_ids = draw(st.lists(st.sampled_from(["p-openai", "p-anthropic", "p-other"]), unique=True))
    return FleetSnapshot(
        nodes=tuple(
            NodeInfo(
                node_id=i,
                url=f"http://{i}",
                load=NodeLoad(kv_cache_usage=draw(st.floats(0, 1))),
                **_placed(draw),
            )  # type: ignore[arg-type]
            for i in node_ids
        ),
        providers=tuple(ProviderInfo(provider_id=i, kind="openai", **_placed(draw)) for i in provider_ids),  # type: ignore[arg-type]
    )


policies = st.builds(tenant, allow_commercial=st.booleans(), allow_degrade=st.booleans())


@settings(max_examples=300, deadline=None)
@given(
    fleet_=fleets(),
    base=policies,
    residency=residencies,
    model=st.sampled_from(MODELS),
    home=st.sampled_from(REGIONS),
    needs=capability_sets,
)
def test_targets_serve_all_the_request_asks_and_unsupported_names_what_none_serves(
    fleet_: FleetSnapshot,
    base: TenantPolicy,
    residency: Residency,
    model: str,
    home: str,
    needs: frozenset[str],
) -> None:
    policy = replace(base, residency=residency)
    asked = RouteRequest(model, home_region=home, needs=needs)
    decision = route(asked, policy, fleet_, catalog=CATALOG)
    plain = route(replace(asked, needs=frozenset()), policy, fleet_, catalog=CATALOG)
    places: dict[str, NodeInfo | ProviderInfo] = {n.node_id: n for n in fleet_.nodes} | {
        p.provider_id: p for p in fleet_.providers
    }

    for target in decision.targets:
        assert needs <= places[target.target_id].capabilities, (target, needs)

    # Ordering and degrading depend on which nodes are in play; the model's own targets and the
    # providers are the same set as without the rule, less those that would refuse the request.
    def own(targets: tuple[Target, ...]) -> set[str]:
        return {t.target_id for t in targets if not t.reason.startswith("degraded")}

    assert own(decision.targets) == {i for i in own(plain.targets) if needs <= places[i].capabilities}

    if decision.targets:
        assert decision.unsupported == ()
        return
    assert decision.unavailable_reason
    inside = [p for p in (*fleet_.nodes, *fleet_.providers) if residency.allows(p.region, p.jurisdiction)]
    # With no node of its own to take it, a request may be degraded to the small tier's nodes.
    small = degrade_model(model, policy, CATALOG)
    considered = [
        p
        for p in inside
        if (model in p.models and (isinstance(p, NodeInfo) or policy.allow_commercial))
        or (small is not None and isinstance(p, NodeInfo) and small.name in p.models)
    ]
    offered = frozenset().union(*(p.capabilities for p in considered))
    assert decision.unsupported == (tuple(sorted(needs - offered)) if considered else ())


def test_a_tools_request_skips_the_nodes_for_a_provider_that_calls_tools() -> None:
    fleet_ = fleet(
        node("us-1", "us-east"),
        providers=(
            replace(provider("anthropic", "us-east"), capabilities=frozenset({"tools"})),
            replace(provider("openai", "us-east"), capabilities=ALL_CAPABILITIES),
        ),
    )
    policy = tenant(allow_commercial=True)
    tools = route(RouteRequest(LARGE, home_region="us-east", needs=frozenset({"tools"})), policy, fleet_)
    assert [t.target_id for t in tools.targets] == ["anthropic", "openai"]
    schema = route(
        RouteRequest(LARGE, home_region="us-east", needs=frozenset({"structured_output"})), policy, fleet_
    )
    assert [t.target_id for t in schema.targets] == ["openai"]
    plain = route(RouteRequest(LARGE, home_region="us-east"), policy, fleet_)
    assert [t.target_id for t in plain.targets] == ["us-1", "anthropic", "openai"]
    logprobs = route(
        RouteRequest(LARGE, home_region="us-east", needs=frozenset({"logprobs"})), policy, fleet_
    )
    assert [t.target_id for t in logprobs.targets] == ["us-1", "openai"]


def test_without_commercial_fallback_a_tools_request_is_unsupported_and_the_reason_says_why() -> None:
    fleet_ = fleet(
        node("us-1", "us-east"),
        providers=(replace(provider("openai", "us-east"), capabilities=ALL_CAPABILITIES),),
    )
    decision = route(
        RouteRequest(LARGE, home_region="us-east", needs=frozenset({"tools"})),
        tenant(allow_commercial=False),
        fleet_,
    )
    assert decision.targets == () and decision.unsupported == ("tools",)
    assert (decision.unavailable_reason or "").startswith(
        "no node serving 'meridian-large' anywhere serves tools;"
    )
    assert "commercial fallback is disabled for this tenant" in (decision.unavailable_reason or "")


def test_a_capable_provider_whose_breaker_is_open_is_unavailable_not_unsupported() -> None:
    broken = replace(provider("openai", "us-east"), capabilities=ALL_CAPABILITIES, healthy=False)
    decision = route(
        RouteRequest(LARGE, home_region="us-east", needs=frozenset({"tools"})),
        tenant(allow_commercial=True),
        fleet(node("us-1", "us-east"), providers=(broken,)),
    )
    assert decision.targets == () and decision.unsupported == ()
    assert "1 provider was unhealthy" in (decision.unavailable_reason or "")


def test_the_pool_admission_judges_is_the_nodes_that_serve_what_the_request_asks() -> None:
    fleet_ = fleet(node("us-1", "us-east", kv=0.9, waiting=50_000))
    assert pool_wait(fleet_, model=LARGE, residency=Residency(), tier="interactive") is not None
    # No node calls tools: nothing for admission to judge (a provider serves it, or routing says why).
    assert (
        pool_wait(fleet_, model=LARGE, residency=Residency(), tier="interactive", needs=frozenset({"tools"}))
        is None
    )
    # Nodes do serve logprobs: the same pool.
    assert (
        pool_wait(
            fleet_, model=LARGE, residency=Residency(), tier="interactive", needs=frozenset({"logprobs"})
        )
        is not None
    )


def test_the_reason_names_what_each_provider_lacks_and_which_are_down() -> None:
    fleet_ = fleet(
        node("us-1", "us-east"),
        providers=(
            replace(provider("anthropic", "us-east"), capabilities=frozenset({"tools"})),
            replace(provider("openai", "us-east"), capabilities=ALL_CAPABILITIES, healthy=False),
        ),
    )
    needs = frozenset({"structured_output"})
    decision = route(
        RouteRequest(LARGE, home_region="us-east", needs=needs), tenant(allow_commercial=True), fleet_
    )
    assert decision.targets == () and decision.unsupported == ()  # the OpenAI one serves it, once up
    assert decision.unavailable_reason == (
        "no node serving 'meridian-large' anywhere serves structured_output; "
        "1 provider not serving structured_output; 1 provider was unhealthy"
    )

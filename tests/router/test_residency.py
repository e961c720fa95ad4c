"""Residency is a hard rule: no order, failover, degrade or fallback ever leaves it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

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
from router.retry import next_targets
from tests.router.builders import (
    CATALOG,
    EU_TENANT,
    JURISDICTION_OF,
    LARGE,
    SMALL,
    fleet,
    node,
    provider,
    tenant,
)

REGIONS = sorted(JURISDICTION_OF)
JURISDICTIONS = sorted(set(JURISDICTION_OF.values()))
MODELS = (SMALL, LARGE)

loads = st.one_of(
    st.none(),
    st.builds(
        NodeLoad,
        kv_cache_usage=st.floats(0.0, 1.0),
        waiting_tokens=st.integers(0, 100_000),
    ),
)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[NodeInfo, ...]:
    ids = draw(st.lists(st.sampled_from([f"n{i}" for i in range(12)]), unique=True, max_size=10))
    return tuple(
        NodeInfo(
            node_id=i,
            url=f"http://{i}",
            region=(region := draw(st.sampled_from(REGIONS))),
            jurisdiction=JURISDICTION_OF[region],
            models=frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2))),
            healthy=draw(st.booleans()),
            load=draw(loads),
        )
        for i in ids
    )


@st.composite
def providers(draw: st.DrawFn) -> tuple[ProviderInfo, ...]:
    ids = draw(st.lists(st.sampled_from(["openai", "anthropic", "azure"]), unique=True, max_size=3))
    return tuple(
        ProviderInfo(
            provider_id=i,
            kind="openai",
            region=(region := draw(st.sampled_from(REGIONS))),
            jurisdiction=JURISDICTION_OF[region],
            models=frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2))),
            healthy=draw(st.booleans()),
        )
        for i in ids
    )


residencies = st.builds(
    Residency,
    jurisdictions=st.frozensets(st.sampled_from(JURISDICTIONS), max_size=2),
    regions=st.frozensets(st.sampled_from(REGIONS), max_size=3),
)
policies = st.builds(
    tenant,
    allow_commercial=st.booleans(),
    allow_degrade=st.booleans(),
    prefix_cache=st.sampled_from(["shared", "isolated"]),
)
fleets = st.builds(FleetSnapshot, nodes=nodes(), providers=providers())


def requests(fleet_: FleetSnapshot) -> st.SearchStrategy[RouteRequest]:
    ids = [n.node_id for n in fleet_.nodes] + [p.provider_id for p in fleet_.providers]
    return st.builds(
        RouteRequest,
        model=st.sampled_from(MODELS),
        home_region=st.sampled_from(REGIONS),
        client_region=st.one_of(st.none(), st.sampled_from(REGIONS)),
        affinity_key=st.text(max_size=20),
        exclude=st.frozensets(st.sampled_from(ids), max_size=len(ids)) if ids else st.just(frozenset()),
    )


@settings(max_examples=200, deadline=None)
@given(data=st.data(), fleet_=fleets, base=policies, residency=residencies)
def test_every_target_is_inside_residency_healthy_serving_and_not_excluded(
    data: st.DataObject, fleet_: FleetSnapshot, base: TenantPolicy, residency: Residency
) -> None:
    policy = replace(base, residency=residency)
    request = data.draw(requests(fleet_))
    decision = route(request, policy, fleet_, catalog=CATALOG)
    places = {n.node_id: n for n in fleet_.nodes} | {p.provider_id: p for p in fleet_.providers}

    ids = [t.target_id for t in decision.targets]
    assert len(ids) == len(set(ids)), "a target appears once"
    for target in decision.targets:
        place = places[target.target_id]
        assert residency.allows(target.region, target.jurisdiction)
        assert residency.allows(place.region, place.jurisdiction)
        assert place.healthy
        assert target.model in place.models
        assert target.target_id not in request.exclude
        if target.model != request.model:
            assert policy.allow_degrade and target.reason.startswith("degraded;")
        if target.kind == "provider":
            assert policy.allow_commercial
    kinds = [t.kind for t in decision.targets]
    assert kinds == sorted(kinds, key=lambda k: k == "provider"), "providers come after all nodes"
    assert (decision.unavailable_reason is None) == bool(decision.targets)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), fleet_=fleets, residency=residencies)
def test_every_admissible_node_is_a_target(
    data: st.DataObject, fleet_: FleetSnapshot, residency: Residency
) -> None:
    policy = replace(tenant(), residency=residency)
    request = data.draw(requests(fleet_))
    decision = route(request, policy, fleet_)
    admissible = {
        n.node_id
        for n in fleet_.nodes
        if request.model in n.models
        and n.healthy
        and residency.allows(n.region, n.jurisdiction)
        and n.node_id not in request.exclude
    }
    assert {t.target_id for t in decision.targets if t.kind == "node"} == admissible


@settings(max_examples=50, deadline=None)
@given(data=st.data(), fleet_=fleets)
def test_failover_never_adds_targets(data: st.DataObject, fleet_: FleetSnapshot) -> None:
    decision = route(data.draw(requests(fleet_)), EU_TENANT, fleet_, catalog=CATALOG)
    failed = data.draw(st.sets(st.sampled_from([t.target_id for t in decision.targets] or ["x"])))
    remaining = next_targets(decision, failed)
    assert set(remaining) <= set(decision.targets)
    assert all(t.jurisdiction == "eu" for t in remaining)


def test_eu_tenant_never_routed_to_us_when_eu_down() -> None:
    fleet_ = fleet(
        node("eu-1", "eu-west", healthy=False),
        node("eu-2", "eu-central", healthy=False),
        node("us-1", "us-east"),
        node("us-2", "us-west"),
        providers=(provider("openai", "us-east"),),
    )
    policy = tenant(jurisdictions=("eu",), allow_commercial=True, allow_degrade=True)

    decision = route(RouteRequest(LARGE, home_region="eu-west"), policy, fleet_, catalog=CATALOG)

    assert decision.targets == ()
    assert decision.unavailable_reason == (
        "no healthy node serving 'meridian-large' in jurisdictions eu; "
        "2 nodes outside the tenant's residency were not considered; "
        "2 nodes inside it were unhealthy; "
        "degrading to 'meridian-small' found no node for it in jurisdictions eu either; "
        "1 provider outside the tenant's residency was not considered"
    )


def test_eu_tenant_after_trying_every_eu_node_gets_no_us_node() -> None:
    fleet_ = fleet(node("eu-1", "eu-west"), node("eu-2", "eu-central"), node("us-1", "us-east"))

    request = RouteRequest(LARGE, home_region="eu-west", exclude=frozenset({"eu-1", "eu-2"}))
    decision = route(request, EU_TENANT, fleet_)

    assert decision.targets == ()
    assert "2 nodes already tried for this request" in (decision.unavailable_reason or "")


def test_a_tenant_without_residency_limit_is_told_its_nodes_were_tried_not_a_residency_reason() -> None:
    # A stream that broke on both nodes: each is excluded, and its failure made it unhealthy.
    fleet_ = fleet(node("us-1", "us-east", healthy=False), node("us-2", "us-east", healthy=False))

    request = RouteRequest(LARGE, home_region="us-east", exclude=frozenset({"us-1", "us-2"}))
    decision = route(request, tenant(), fleet_)

    assert decision.unavailable_reason == (
        "no healthy node serving 'meridian-large' anywhere; 2 nodes already tried for this request"
    )


def test_regions_and_jurisdictions_both_narrow() -> None:
    fleet_ = fleet(node("w", "eu-west"), node("c", "eu-central"), node("u", "us-east"))
    policy = tenant(jurisdictions=("eu",), regions=("eu-central", "us-east"))

    decision = route(RouteRequest(LARGE, home_region="eu-west"), policy, fleet_)

    assert [t.target_id for t in decision.targets] == ["c"]


def test_client_in_us_does_not_pull_eu_tenant_out_of_eu() -> None:
    fleet_ = fleet(node("eu-1", "eu-west"), node("us-1", "us-east"))

    request = RouteRequest(LARGE, home_region="us-east", client_region="us-east")
    decision = route(request, EU_TENANT, fleet_)

    assert [t.target_id for t in decision.targets] == ["eu-1"]

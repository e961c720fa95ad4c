"""Residency applies to commercial providers: the router never offers one outside the tenant's."""

from __future__ import annotations

from dataclasses import replace

from router import route
from router.types import (
    FleetSnapshot,
    NodeInfo,
    ProviderInfo,
    Residency,
    RouteRequest,
    TenantPolicy,
)

US = ProviderInfo("openai-us", "openai", "us-east", "US", frozenset({"tiny"}))
EU = ProviderInfo("anthropic-eu", "anthropic", "eu-west", "EU", frozenset({"tiny"}))
EU_NODE = NodeInfo("eu-1", "http://eu-1", "eu-west", "EU", frozenset({"tiny"}))
REQUEST = RouteRequest(model="tiny", home_region="us-east")


def tenant(*, eu_only: bool, commercial: bool = True) -> TenantPolicy:
    residency = Residency(jurisdictions=frozenset({"EU"})) if eu_only else Residency()
    return TenantPolicy("t", frozenset(), residency=residency, allow_commercial=commercial)


def ids(policy: TenantPolicy, fleet: FleetSnapshot) -> list[str]:
    return [t.target_id for t in route(REQUEST, policy, fleet).targets]


def test_eu_tenant_is_never_routed_to_a_us_provider() -> None:
    fleet = FleetSnapshot(nodes=(EU_NODE,), providers=(US, EU))
    assert ids(tenant(eu_only=True), fleet) == ["eu-1", "anthropic-eu"]


def test_eu_tenant_with_eu_fleet_down_and_only_a_us_provider_gets_no_target() -> None:
    down = FleetSnapshot(nodes=(replace(EU_NODE, healthy=False),), providers=(US,))
    decision = route(REQUEST, tenant(eu_only=True), down)
    assert decision.targets == ()
    assert decision.unavailable_reason


def test_providers_come_after_nodes_and_only_when_commercial_is_allowed() -> None:
    fleet = FleetSnapshot(nodes=(EU_NODE,), providers=(US, EU))
    assert ids(tenant(eu_only=False), fleet)[0] == "eu-1"
    assert set(ids(tenant(eu_only=False), fleet)[1:]) == {"openai-us", "anthropic-eu"}
    assert ids(tenant(eu_only=False, commercial=False), fleet) == ["eu-1"]


def test_provider_with_open_breaker_is_not_offered() -> None:
    fleet = FleetSnapshot(providers=(replace(EU, healthy=False), US))
    assert ids(tenant(eu_only=False), fleet) == ["openai-us"]

"""Residency holds with Consul membership: an EU tenant never reaches a US node."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.discovery.consul import ConsulDirectoryConfig, ConsulRegionDirectory
from protocol.consul.client import ConsulClient, ConsulConfig
from router import FleetSnapshot, Residency, RouteRequest, TenantPolicy, route
from tests.consul.registrations import node_registration
from tests.consul.timing import eventually
from tests.consul_api import ConsulStandIn

EU_TENANT = TenantPolicy(
    tenant_id="eu-bank", api_key_hashes=frozenset(), residency=Residency(jurisdictions=frozenset({"EU"}))
)
ANY_TENANT = TenantPolicy(tenant_id="anywhere", api_key_hashes=frozenset())
EU_CHECK = "service:eu-1-127.0.0.1:9001"


@pytest.fixture
async def fleet(consul: ConsulStandIn, client: ConsulClient) -> AsyncIterator[ConsulRegionDirectory]:
    """An EU node (dc "eu") and a US node (dc "us"), both passing, both serving meridian-small."""
    await client.register_service(node_registration("eu-1", port=9001))
    await client.update_ttl(EU_CHECK, "pass")
    async with ConsulClient(ConsulConfig(address=consul.address("us"))) as us_agent:
        await us_agent.register_service(
            node_registration("us-1", region="us-east", jurisdiction="US", port=9002)
        )
        await us_agent.update_ttl("service:us-1-127.0.0.1:9002", "pass")
    directory = ConsulRegionDirectory(
        ConsulDirectoryConfig(address=consul.address("eu"), datacenters=("eu", "us"))
    )
    await directory.start()
    await eventually(lambda: len(directory.snapshot()) == 2, within=2)
    yield directory
    await directory.stop()


def targets(policy: TenantPolicy, directory: ConsulRegionDirectory, home_region: str) -> list[str]:
    request = RouteRequest(model="meridian-small", home_region=home_region)
    decision = route(request, policy, FleetSnapshot(nodes=directory.snapshot()))
    return [target.target_id for target in decision.targets]


async def test_eu_tenant_is_routed_only_to_eu_nodes_even_from_a_us_gateway(
    fleet: ConsulRegionDirectory,
) -> None:
    assert targets(EU_TENANT, fleet, home_region="us-east") == ["eu-1"]
    assert set(targets(ANY_TENANT, fleet, home_region="us-east")) == {"eu-1", "us-1"}


async def test_eu_tenant_never_routed_to_us_when_eu_node_leaves_consul(
    fleet: ConsulRegionDirectory, client: ConsulClient
) -> None:
    await client.update_ttl(EU_CHECK, "fail", "not ready")
    await eventually(lambda: [n.node_id for n in fleet.snapshot()] == ["us-1"], within=2)
    request = RouteRequest(model="meridian-small", home_region="us-east")
    decision = route(request, EU_TENANT, FleetSnapshot(nodes=fleet.snapshot()))
    assert decision.targets == ()
    assert decision.unavailable_reason


async def test_eu_tenant_stays_in_the_eu_on_stale_membership_while_consul_is_down(
    consul: ConsulStandIn, fleet: ConsulRegionDirectory
) -> None:
    consul.stop()
    await eventually(lambda: fleet.stale, within=5)
    assert targets(EU_TENANT, fleet, home_region="us-east") == ["eu-1"]

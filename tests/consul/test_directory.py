"""The gateway's Consul directory: membership follows Consul, and survives Consul going away."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from gateway.discovery.consul import ConsulDirectoryConfig, ConsulRegionDirectory
from protocol.consul.client import ConsulClient, ConsulConfig
from protocol.consul.wire import ServiceRegistration
from tests.consul.registrations import node_registration
from tests.consul.timing import eventually
from tests.consul_api import ConsulStandIn

DirectoryFactory = Callable[..., ConsulRegionDirectory]


def fast_config(consul: ConsulStandIn, **overrides: object) -> ConsulDirectoryConfig:
    settings: dict[str, object] = {
        "address": consul.address("eu"),
        "datacenters": ("eu", "us"),
        "wait_s": 5.0,
        "connect_timeout_s": 0.5,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.3,
    }
    settings.update(overrides)
    return ConsulDirectoryConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture
async def directories(consul: ConsulStandIn) -> AsyncIterator[DirectoryFactory]:
    started: list[ConsulRegionDirectory] = []

    async def make(registry: CollectorRegistry | None = None, **overrides: object) -> ConsulRegionDirectory:
        directory = ConsulRegionDirectory(fast_config(consul, **overrides), registry=registry)
        await directory.start()
        started.append(directory)
        return directory

    yield make  # type: ignore[misc]
    for directory in started:
        await directory.stop()


async def register_passing(client: ConsulClient, registration: ServiceRegistration) -> None:
    await client.register_service(registration)
    assert registration.Check is not None
    await client.update_ttl(registration.Check.CheckID, "pass", "ready")


def ids(directory: ConsulRegionDirectory) -> set[str]:
    return {node.node_id for node in directory.snapshot()}


async def test_a_registered_passing_node_appears_with_its_url_region_and_models(
    client: ConsulClient, directories: DirectoryFactory
) -> None:
    directory = await directories()
    assert directory.snapshot() == ()
    registration = node_registration(
        "eu-1", port=9101, models=(("meridian-small", "small"), ("meridian-large", "large"))
    )
    await register_passing(client, registration)
    await eventually(lambda: ids(directory) == {"eu-1"}, within=2)
    [node] = directory.snapshot()
    assert node.url == "http://127.0.0.1:9101"
    assert (node.region, node.jurisdiction) == ("eu-west", "EU")
    assert node.models == frozenset({"meridian-small", "meridian-large"})
    assert node.healthy


async def test_a_node_without_a_service_address_is_reached_at_its_agents_address(
    client: ConsulClient, directories: DirectoryFactory
) -> None:
    directory = await directories()
    await register_passing(client, node_registration("eu-1", host="0.0.0.0", port=9101))
    await eventually(lambda: ids(directory) == {"eu-1"}, within=2)
    assert directory.snapshot()[0].url == "http://127.0.0.1:9101"


async def test_nodes_from_every_watched_datacenter_are_listed(
    consul: ConsulStandIn, client: ConsulClient, directories: DirectoryFactory
) -> None:
    directory = await directories()
    await register_passing(client, node_registration("eu-1"))
    async with ConsulClient(ConsulConfig(address=consul.address("us"))) as us_agent:
        await register_passing(us_agent, node_registration("us-1", region="us-east", jurisdiction="US"))
    await eventually(lambda: ids(directory) == {"eu-1", "us-1"}, within=2)


async def test_a_node_failing_its_ttl_leaves_within_a_second(
    client: ConsulClient, directories: DirectoryFactory
) -> None:
    directory = await directories()
    registration = node_registration("eu-1")
    await register_passing(client, registration)
    await eventually(lambda: ids(directory) == {"eu-1"}, within=2)
    assert registration.Check is not None
    await client.update_ttl(registration.Check.CheckID, "fail", "not ready")
    took = await eventually(lambda: ids(directory) == set(), within=3)
    assert took < 1.0
    await client.update_ttl(registration.Check.CheckID, "pass", "ready")
    await eventually(lambda: ids(directory) == {"eu-1"}, within=1)


async def test_a_node_whose_ttl_lapses_leaves_before_the_ttl_is_out_by_much(
    client: ConsulClient, directories: DirectoryFactory
) -> None:
    directory = await directories()
    await register_passing(client, node_registration("eu-1", ttl_s=0.5))
    await eventually(lambda: ids(directory) == {"eu-1"}, within=2)
    # No more heartbeats: the node is gone within the TTL plus well under a second.
    took = await eventually(lambda: ids(directory) == set(), within=3)
    assert took < 0.5 + 1.0


async def test_consul_down_keeps_the_last_membership_and_says_it_is_stale(
    consul: ConsulStandIn,
    client: ConsulClient,
    directories: DirectoryFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    directory = await directories(registry)
    await register_passing(client, node_registration("eu-1"))
    await eventually(lambda: ids(directory) == {"eu-1"}, within=2)
    assert registry.get_sample_value("meridian_gateway_discovery_stale") == 0
    caplog.set_level(logging.WARNING, logger="gateway.discovery.consul")
    consul.stop()
    await eventually(
        lambda: (registry.get_sample_value("meridian_gateway_discovery_errors_total") or 0) >= 6, within=5
    )
    assert ids(directory) == {"eu-1"}, "routing keeps the last membership while Consul is away"
    assert directory.stale
    assert registry.get_sample_value("meridian_gateway_discovery_stale") == 1
    outage_logs = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(outage_logs) == 2, "one warning per datacenter per outage, not one per retry"


async def test_watching_resumes_when_consul_returns_and_new_nodes_appear(
    consul: ConsulStandIn, client: ConsulClient, directories: DirectoryFactory
) -> None:
    registry = CollectorRegistry()
    directory = await directories(registry)
    await register_passing(client, node_registration("eu-1"))
    await eventually(lambda: ids(directory) == {"eu-1"}, within=2)
    consul.stop()
    await eventually(lambda: directory.stale, within=3)
    consul.start()
    await register_passing(client, node_registration("eu-2", port=9002))
    await eventually(lambda: ids(directory) == {"eu-1", "eu-2"}, within=3)
    assert not directory.stale
    assert registry.get_sample_value("meridian_gateway_discovery_stale") == 0


async def test_a_rebuilt_consul_with_a_lower_index_is_followed_within_one_wait(
    consul: ConsulStandIn, client: ConsulClient, directories: DirectoryFactory
) -> None:
    directory = await directories(wait_s=1.0)
    for i in range(4):
        await register_passing(client, node_registration(f"eu-{i}", port=9000 + i))
    await eventually(lambda: len(ids(directory)) == 4, within=2)
    # Rebuilt so fast that the watch may never see an error: its next query carries an index the new
    # cluster has not reached, which Consul holds for the whole wait and then answers with a lower
    # index; the watch must start over from there instead of waiting on that index forever.
    consul.restart(keep_state=False)
    await register_passing(client, node_registration("eu-new", port=9100))
    await eventually(lambda: ids(directory) == {"eu-new"}, within=1.0 * (1 + 1 / 16) + 2.0)


async def test_a_consul_outage_then_rebuild_shows_the_new_membership_promptly(
    consul: ConsulStandIn, client: ConsulClient, directories: DirectoryFactory
) -> None:
    directory = await directories()
    for i in range(4):
        await register_passing(client, node_registration(f"eu-{i}", port=9000 + i))
    await eventually(lambda: len(ids(directory)) == 4, within=2)
    consul.stop()
    await eventually(lambda: directory.stale_datacenters == {"eu", "us"}, within=3)
    consul.restart(keep_state=False)
    await register_passing(client, node_registration("eu-new", port=9100))
    await eventually(lambda: ids(directory) == {"eu-new"}, within=2)


async def test_a_consul_that_is_down_at_start_up_does_not_stop_the_gateway(consul: ConsulStandIn) -> None:
    address = consul.address("eu")
    consul.stop()
    directory = ConsulRegionDirectory(fast_config(consul, address=address, initial_sync_timeout_s=0.3))
    await directory.start()
    try:
        assert directory.snapshot() == () and directory.stale
        consul.start()
        async with ConsulClient(ConsulConfig(address=address)) as client:
            await register_passing(client, node_registration("eu-1"))
        await eventually(lambda: ids(directory) == {"eu-1"}, within=3)
    finally:
        await directory.stop()


async def test_instances_without_meridian_metadata_are_ignored(
    client: ConsulClient, directories: DirectoryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    from protocol.consul.wire import ServiceCheck

    directory = await directories()
    caplog.set_level(logging.WARNING, logger="gateway.discovery.consul")
    stray = ServiceRegistration(
        Name="meridian-node", ID="stray", Port=1, Check=ServiceCheck(TTL="30s", Status="passing")
    )
    await client.register_service(stray)
    await register_passing(client, node_registration("eu-1"))
    await eventually(lambda: ids(directory) == {"eu-1"}, within=2)
    assert sum("stray" in r.getMessage() for r in caplog.records) == 1


async def test_stop_cancels_the_watches(consul: ConsulStandIn) -> None:
    directory = ConsulRegionDirectory(fast_config(consul))
    await directory.start()
    await directory.stop()
    assert all(task.done() for task in directory._tasks) and not directory._tasks

"""A regional node in Consul: registered on start, passing while ready, gone on stop."""

from __future__ import annotations

import asyncio

import pytest

from protocol.consul.advertisement import ModelTag, decode_models, encode_models
from protocol.consul.client import ConsulClient, ConsulConfig
from regional_node.discovery import (
    ConsulRegistration,
    ConsulRegistrationConfig,
    RegistrationError,
    build_registration,
)
from tests.consul.registrations import node_registration
from tests.consul.timing import eventually
from tests.consul_api import ConsulStandIn

SERVICE_ID = "eu-1-127.0.0.1:9001"
CHECK_ID = f"service:{SERVICE_ID}"


def test_the_service_definition_carries_region_jurisdiction_and_models() -> None:
    registration = node_registration(
        "eu-1", models=(("meridian-small", "small"), ("meridian-large", "large")), ttl_s=10
    )
    assert registration.Name == "meridian-node"
    assert registration.ID == SERVICE_ID
    assert (registration.Address, registration.Port) == ("127.0.0.1", 9001)
    assert registration.Meta == {
        "node_id": "eu-1",
        "region": "eu-west",
        "jurisdiction": "EU",
        "models": "meridian-small:small,meridian-large:large",
        "scheme": "http",
    }
    assert set(registration.Tags) >= {"region=eu-west", "jurisdiction=EU", "model=meridian-large"}
    assert registration.Check is not None
    assert (registration.Check.TTL, registration.Check.DeregisterCriticalServiceAfter) == ("10s", "60s")
    assert registration.Check.Status == "critical"


def test_a_node_listening_on_all_interfaces_leaves_the_address_to_the_agent() -> None:
    assert node_registration("n", host="0.0.0.0").Address == ""


def test_metadata_consul_would_reject_is_caught_before_registering() -> None:
    many = tuple((f"model-{i:03d}-{'x' * 20}", "small") for i in range(40))
    with pytest.raises(RegistrationError, match="longer than 512"):
        build_registration(
            ConsulRegistrationConfig(),
            node_id="n",
            region="r",
            jurisdiction="j",
            host="h",
            port=1,
            models=many,
        )


def test_models_round_trip_through_meta_even_with_colons_in_names() -> None:
    models = (ModelTag("llama3:8b", "large"), ModelTag("meridian-small", "small"))
    assert decode_models(encode_models(models)) == models


async def _passing_ids(client: ConsulClient) -> list[str]:
    return [e.Service.ID for e in (await client.health_service("meridian-node")).entries]


async def test_a_ready_node_registers_and_passes(consul: ConsulStandIn, client: ConsulClient) -> None:
    registration = ConsulRegistration(client, node_registration("eu-1"), readiness=lambda: True)
    await registration.start()
    try:
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "passing")
        assert await _passing_ids(client) == [SERVICE_ID]
    finally:
        await registration.stop()


async def test_a_node_that_is_not_ready_leaves_the_passing_set_and_comes_back(
    consul: ConsulStandIn, client: ConsulClient
) -> None:
    ready = True
    registration = ConsulRegistration(client, node_registration("eu-1"), readiness=lambda: ready)
    await registration.start()
    try:
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "passing")
        ready = False
        registration.readiness_changed()
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "critical")
        assert await _passing_ids(client) == []
        ready = True
        registration.readiness_changed()
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "passing")
        assert await _passing_ids(client) == [SERVICE_ID]
    finally:
        await registration.stop()


async def test_not_ready_is_reported_within_a_third_of_the_ttl(
    consul: ConsulStandIn, client: ConsulClient
) -> None:
    ready = True
    registration = ConsulRegistration(client, node_registration("eu-1", ttl_s=1.5), readiness=lambda: ready)
    await registration.start()
    try:
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "passing")
        ready = False  # no nudge: the periodic heartbeat (every ttl/3 = 0.5 s) must notice
        took = await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "critical", within=3)
        assert took < 1.5
    finally:
        await registration.stop()


async def test_a_clean_shutdown_deregisters(consul: ConsulStandIn, client: ConsulClient) -> None:
    registration = ConsulRegistration(client, node_registration("eu-1"), readiness=lambda: True)
    await registration.start()
    assert consul.service_ids("eu") == {SERVICE_ID}
    await registration.stop()
    assert consul.service_ids("eu") == set()


async def test_a_node_that_stops_heartbeating_expires_and_is_reaped(
    consul: ConsulStandIn, client: ConsulClient
) -> None:
    # A hung or killed node: one heartbeat, then silence, and nobody deregisters it.
    await client.register_service(node_registration("eu-1", ttl_s=0.3, deregister_critical_after_s=0.5))
    await client.update_ttl(CHECK_ID, "pass", "ready")
    assert await _passing_ids(client) == [SERVICE_ID]
    await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "critical", within=3)
    await eventually(lambda: consul.service_ids("eu") == set(), within=3)


async def test_a_node_registers_again_when_consul_forgets_it(
    consul: ConsulStandIn, client: ConsulClient
) -> None:
    registration = ConsulRegistration(client, node_registration("eu-1", ttl_s=0.6), readiness=lambda: True)
    await registration.start()
    try:
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "passing")
        consul.restart(keep_state=False)
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "passing", within=5)
    finally:
        await registration.stop()


async def test_a_node_started_while_consul_is_down_registers_when_it_comes_up() -> None:
    consul = ConsulStandIn()
    consul.start()
    address = consul.address()
    consul.stop()
    config = ConsulConfig(address=address, connect_timeout_s=0.5)
    async with ConsulClient(config) as client:
        registration = ConsulRegistration(
            client, node_registration("eu-1"), readiness=lambda: True, retry_max_s=0.3
        )
        await registration.start()  # must not raise or hang while Consul is down
        consul.start()
        try:
            await eventually(lambda: consul.check_status(CHECK_ID) == "passing", within=5)
        finally:
            await registration.stop()
            consul.stop()


async def test_models_failing_their_probes_are_published_in_meta(
    consul: ConsulStandIn, client: ConsulClient
) -> None:
    failing: list[str] = []
    registration = ConsulRegistration(
        client, node_registration("eu-1"), readiness=lambda: True, failing_models=lambda: failing
    )

    async def meta() -> dict[str, str]:
        (entry,) = (await client.health_service("meridian-node")).entries
        return dict(entry.Service.Meta or {})

    async def published(value: str | None) -> bool:
        return (await meta()).get("probe_failed") == value

    async def eventually_published(value: str | None) -> None:
        deadline = asyncio.get_running_loop().time() + 10
        while not await published(value):
            assert asyncio.get_running_loop().time() < deadline, f"meta never said {value!r}"
            await asyncio.sleep(0.05)

    await registration.start()
    try:
        await eventually(lambda: consul.check_status(CHECK_ID, "eu") == "passing")
        assert "probe_failed" not in await meta()
        failing.append("meridian-small")
        registration.readiness_changed()
        await eventually_published("meridian-small")
        # Registering again kept the check passing: the node stayed in the passing set.
        assert await _passing_ids(client) == [SERVICE_ID]
        failing.clear()
        registration.readiness_changed()
        await eventually_published(None)
    finally:
        await registration.stop()

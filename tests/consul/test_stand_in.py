"""The stand-in answers like Consul's documented API for what Meridian uses (status codes, shapes)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from protocol.consul.client import (
    ConsulClient,
    ConsulConfig,
    ConsulNotFound,
    ConsulPermissionDenied,
    ConsulRequestRejected,
    ConsulUnavailable,
)
from protocol.consul.wire import ServiceCheck, ServiceRegistration
from tests.consul.registrations import node_registration
from tests.consul.timing import eventually
from tests.consul_api import ConsulStandIn

SERVICE = "meridian-node"


def test_register_without_a_name_is_a_400() -> None:
    with ConsulStandIn() as consul:
        response = httpx.put(f"{consul.url()}/v1/agent/service/register", json={"Port": 1})
    assert (response.status_code, response.text) == (400, "Missing service name")


async def test_register_on_the_wildcard_address_is_refused(client: ConsulClient) -> None:
    with pytest.raises(ConsulRequestRejected, match="Invalid service address"):
        await client.register_service(ServiceRegistration(Name=SERVICE, Address="0.0.0.0", Port=1))


async def test_meta_keys_outside_consuls_charset_are_refused(client: ConsulClient) -> None:
    with pytest.raises(ConsulRequestRejected, match="Invalid Service Meta"):
        await client.register_service(ServiceRegistration(Name=SERVICE, Port=1, Meta={"model.name": "x"}))


async def test_deregistering_an_unknown_service_is_a_404(client: ConsulClient) -> None:
    with pytest.raises(ConsulNotFound, match="Unknown service ID"):
        await client.deregister_service("nope")


async def test_updating_an_unknown_check_is_a_404(client: ConsulClient) -> None:
    with pytest.raises(ConsulNotFound, match="Unknown check ID"):
        await client.update_ttl("service:nope", "pass")


async def test_health_entries_have_node_service_and_checks(client: ConsulClient) -> None:
    await client.register_service(node_registration("eu-1"))
    async with httpx.AsyncClient() as http:
        response = await http.get(f"{client.config.base_url()}/v1/health/service/{SERVICE}")
    [entry] = response.json()
    assert set(entry) == {"Node", "Service", "Checks"}
    assert entry["Node"]["Datacenter"] == "eu"
    assert entry["Service"]["Meta"]["region"] == "eu-west"
    assert [c["CheckID"] for c in entry["Checks"]] == ["serfHealth", "service:eu-1-127.0.0.1:9001"]
    assert entry["Checks"][1]["Status"] == "critical", "TTL checks start critical"
    assert int(response.headers["X-Consul-Index"]) >= 1


async def test_passing_filter_excludes_warning_and_critical_instances(client: ConsulClient) -> None:
    for node_id, status in (("a", "pass"), ("b", "warn"), ("c", "fail")):
        await client.register_service(node_registration(node_id))
        await client.update_ttl(f"service:{node_id}-127.0.0.1:9001", status, "note")
    passing = await client.health_service(SERVICE, passing=True)
    everything = await client.health_service(SERVICE, passing=False)
    assert [e.Service.ID for e in passing.entries] == ["a-127.0.0.1:9001"]
    assert len(everything.entries) == 3


async def test_a_lapsed_ttl_turns_critical_with_consuls_output(client: ConsulClient) -> None:
    registration = node_registration("eu-1", ttl_s=0.3)
    await client.register_service(registration)
    await client.update_ttl("service:eu-1-127.0.0.1:9001", "pass", "ready")
    assert len((await client.health_service(SERVICE)).entries) == 1
    await asyncio.sleep(0.6)
    [entry] = (await client.health_service(SERVICE, passing=False)).entries
    assert entry.Checks is not None
    assert entry.Checks[1].Status == "critical"
    assert entry.Checks[1].Output.startswith("TTL expired")


async def test_long_critical_services_are_reaped(consul: ConsulStandIn, client: ConsulClient) -> None:
    await client.register_service(node_registration("eu-1", ttl_s=0.2, deregister_critical_after_s=0.3))
    await eventually(lambda: consul.service_ids("eu") == set(), within=3)


async def test_reaping_honours_consuls_one_minute_minimum_by_default() -> None:
    with ConsulStandIn(reap_interval_s=0.05) as consul:
        async with ConsulClient(ConsulConfig(address=consul.address())) as client:
            await client.register_service(node_registration("n", ttl_s=0.1, deregister_critical_after_s=0.1))
            await asyncio.sleep(0.5)
        assert consul.service_ids() == {"n-127.0.0.1:9001"}


async def test_with_acls_writes_need_a_token_and_unknown_tokens_are_refused() -> None:
    with ConsulStandIn(acl_token="s3cret") as consul:
        async with ConsulClient(ConsulConfig(address=consul.address())) as anonymous:
            with pytest.raises(ConsulPermissionDenied, match="Permission denied"):
                await anonymous.register_service(node_registration("n"))
            hidden = await anonymous.health_service(SERVICE)
        async with ConsulClient(ConsulConfig(address=consul.address(), token="wrong")) as wrong:
            with pytest.raises(ConsulPermissionDenied, match="ACL not found"):
                await wrong.health_service(SERVICE)
        async with ConsulClient(ConsulConfig(address=consul.address(), token="s3cret")) as allowed:
            await allowed.register_service(node_registration("n"))
            visible = await allowed.health_service(SERVICE, passing=False)
    assert hidden.filtered_by_acls and hidden.entries == ()
    assert len(visible.entries) == 1 and not visible.filtered_by_acls


async def test_the_token_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CONSUL_TOKEN", "s3cret")
    with ConsulStandIn(acl_token="s3cret") as consul:
        async with ConsulClient(
            ConsulConfig(address=consul.address(), token_env="TEST_CONSUL_TOKEN")
        ) as client:
            await client.register_service(node_registration("n"))


async def test_dc_parameter_reads_another_datacenter(consul: ConsulStandIn, client: ConsulClient) -> None:
    async with ConsulClient(ConsulConfig(address=consul.address("us"))) as us_agent:
        await us_agent.register_service(node_registration("us-1", region="us-east", jurisdiction="US"))
    local = await client.health_service(SERVICE, passing=False)
    remote = await client.health_service(SERVICE, passing=False, datacenter="us")
    assert local.entries == ()
    assert [e.Node.Datacenter for e in remote.entries] == ["us"]


async def test_an_unknown_datacenter_is_a_500(client: ConsulClient) -> None:
    with pytest.raises(ConsulUnavailable, match="No path to datacenter"):
        await client.health_service(SERVICE, datacenter="mars")


async def test_an_empty_service_address_falls_back_to_the_node_address(client: ConsulClient) -> None:
    await client.register_service(node_registration("n", host="0.0.0.0"))
    [entry] = (await client.health_service(SERVICE, passing=False)).entries
    assert entry.Service.Address == ""
    assert entry.address() == entry.Node.Address == "127.0.0.1"


async def test_stopping_consul_cuts_blocked_queries(consul: ConsulStandIn, client: ConsulClient) -> None:
    first = await client.health_service(SERVICE)
    watch = asyncio.create_task(client.health_service(SERVICE, index=first.index, wait_s=30))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    consul.stop()
    with pytest.raises(ConsulUnavailable):
        await asyncio.wait_for(watch, 5)
    assert time.monotonic() - started < 2.0


async def test_a_restart_keeps_the_port_and_optionally_the_catalog(
    consul: ConsulStandIn, client: ConsulClient
) -> None:
    await client.register_service(
        ServiceRegistration(Name=SERVICE, ID="x", Port=1, Check=ServiceCheck(TTL="30s"))
    )
    consul.restart(keep_state=True)
    assert [e.Service.ID for e in (await client.health_service(SERVICE, passing=False)).entries] == ["x"]
    consul.restart(keep_state=False)
    assert (await client.health_service(SERVICE, passing=False)).entries == ()


async def test_the_leader_endpoint_answers_for_liveness_checks(
    consul: ConsulStandIn, client: ConsulClient
) -> None:
    assert await client.leader() == "127.0.0.1:8300"
    consul.stop()
    with pytest.raises(ConsulUnavailable):
        await client.leader()

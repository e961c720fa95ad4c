"""Where a batch callback may go (gateway/batches/callbacks.py): only to globally routable
addresses, or into the networks the operator allowed; an IPv4 address carried inside an IPv6 one is
judged as that IPv4 address; names are judged by every address they resolve to."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.batches.callbacks import CallbackEgress, CallbackRefused, networks

CLOSED = CallbackEgress()
IPV4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
IPV6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)

# Where an unchecked callback does harm: loopback, the private ranges, link-local (cloud metadata),
# shared address space, "this network", multicast, and each of them wrapped in IPv6.
REFUSED = [
    "127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::", "fe80::1", "fc00::1", "ff02::1",
    "::ffff:10.0.0.1", "::ffff:127.0.0.1", "2002:a00:1::1", "2002:a9fe:a9fe::", "64:ff9b::a9fe:a9fe",
    "64:ff9b::7f00:1", "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1 (obfuscated)
]  # fmt: skip
PERMITTED = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused_by_default(address: str) -> None:
    assert not CLOSED.permits(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", PERMITTED)
def test_public_addresses_are_permitted(address: str) -> None:
    assert CLOSED.permits(ipaddress.ip_address(address))


@given(address=IPV4)
def test_an_ipv4_address_is_permitted_exactly_when_it_is_public(address: ipaddress.IPv4Address) -> None:
    public = address.is_global and not (address.is_multicast or address.is_reserved)
    assert CLOSED.permits(address) == public


@given(address=IPV4)
def test_an_ipv4_address_wrapped_in_ipv6_is_judged_as_itself(address: ipaddress.IPv4Address) -> None:
    value = int(address)
    wrapped = [
        ipaddress.IPv6Address((0xFFFF << 32) | value),  # mapped
        ipaddress.IPv6Address((0x2002 << 112) | (value << 80)),  # 6to4
        ipaddress.IPv6Address((0x64FF9B << 96) | value),  # NAT64
    ]
    assert all(CLOSED.permits(v6) == CLOSED.permits(address) for v6 in wrapped)


@given(address=IPV4 | IPV6, prefix=st.integers(0, 32))
def test_an_allowed_network_admits_its_addresses_and_nothing_else_changes(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, prefix: int
) -> None:
    network = ipaddress.ip_network(f"{address}/{prefix * address.max_prefixlen // 32}", strict=False)
    opened = CallbackEgress(networks((str(network),)))
    assert opened.permits(address)
    other = ipaddress.ip_address("8.8.4.4" if address.version == 6 else "2001:4860:4860::8844")
    assert opened.permits(other) == CLOSED.permits(other)


@pytest.mark.parametrize("host", ["localhost", "127.1", "0x7f000001", "2130706433", "017700000001"])
def test_a_name_is_judged_by_the_addresses_it_resolves_to(host: str) -> None:
    """Loopback by name, and in the shorthand, hex, decimal and octal forms the resolver reads."""
    with pytest.raises(CallbackRefused, match=f"{host} is"):
        asyncio.run(CLOSED.address_for(host, 80))


def test_an_allowed_name_resolves_to_the_address_sent_to() -> None:
    loopback = CallbackEgress(networks(("127.0.0.0/8", "::1")))
    assert ipaddress.ip_address(asyncio.run(loopback.address_for("localhost", 80))).is_loopback
    assert asyncio.run(loopback.address_for("127.0.0.1", 80)) == "127.0.0.1"

"""Where a batch's callback may be POSTed. The tenant names the URL, so the gateway checks where
it points before sending, and sends to the address it checked.

Unchecked, a tenant could make the gateway POST into the network it runs in: its admin listener,
a node, a cloud metadata service (169.254.169.254), anything on 10.0.0.0/8. So an address that is
not globally routable (private, loopback, link-local, shared, reserved, multicast, unspecified)
is refused unless the operator lists its network in `batches.callback_allowed_networks`. An IPv4
address carried inside an IPv6 one (mapped, 6to4, Teredo, NAT64's 64:ff9b::/96) is judged as that
IPv4 address, which is where a packet to it ends up.

The host is resolved once, when sending, and every address it resolves to must pass; the POST then
goes to one of those addresses, with the URL's host in `Host` and as the TLS server name. A second
lookup, whose answer an attacker's DNS could change in between (DNS rebinding), never happens.
Redirects are not followed (httpx's default), so a permitted host cannot bounce the POST inward.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class CallbackRefused(Exception):
    """The callback URL points where callbacks may not go: no try can succeed."""


def networks(specs: tuple[str, ...]) -> tuple[Network, ...]:
    """`batches.callback_allowed_networks` as networks (a host address is a network of one)."""
    return tuple(ipaddress.ip_network(spec, strict=False) for spec in specs)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client end, where the tunnel delivers
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


@dataclass(frozen=True)
class CallbackEgress:
    allowed: tuple[Network, ...] = ()

    def permits(self, address: Address) -> bool:
        if any(address.version == net.version and address in net for net in self.allowed):
            return True
        if isinstance(address, ipaddress.IPv6Address) and (inner := _embedded_ipv4(address)) is not None:
            return self.permits(inner)
        return address.is_global and not (address.is_multicast or address.is_reserved)

    async def address_for(self, host: str, port: int) -> str:
        """The address to send to: `host` (a name or an address) resolved, each of its addresses
        checked. CallbackRefused names one that is not permitted; a failed lookup is an OSError
        (a later try may succeed)."""
        try:
            addresses: list[Address] = [ipaddress.ip_address(host)]
        except ValueError:
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            # An IPv6 address may come with its zone (`fe80::1%eth0`); the zone is no part of it.
            addresses = [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in found]
        if not addresses:
            raise OSError(f"{host} resolved to no address")
        for address in addresses:
            if not self.permits(address):
                raise CallbackRefused(
                    f"{host} is {address}, an address callbacks may not reach "
                    "(not globally routable, and not in batches.callback_allowed_networks)"
                )
        return str(addresses[0])

    async def post(self, client: httpx.AsyncClient, url: str, payload: Any) -> httpx.Response:
        """POST `payload` as JSON to `url`, at the address `address_for` checked."""
        target = httpx.URL(url)
        port = target.port or (443 if target.scheme == "https" else 80)
        address = await self.address_for(target.host, port)
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        return await client.post(
            target.copy_with(host=address),
            json=payload,
            headers={"host": target.netloc.decode("ascii")},
            extensions=extensions,
        )

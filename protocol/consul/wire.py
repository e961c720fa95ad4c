"""Consul's JSON shapes for the few endpoints Meridian uses, as msgspec structs.

Field names are Consul's (PascalCase) on the wire. Only the fields we read or write are declared;
msgspec ignores the rest of Consul's (large) objects when decoding, so new Consul versions that add
fields do not break us.
"""

from __future__ import annotations

import msgspec

# Consul's limits on service metadata (agent/structs ValidateServiceMetadata).
META_MAX_KEYS = 64
META_KEY_MAX_LEN = 128
META_VALUE_MAX_LEN = 512
META_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class ServiceCheck(msgspec.Struct, omit_defaults=True):
    """The `Check` of a service registration (only TTL checks are used by Meridian)."""

    CheckID: str = ""
    Name: str = ""
    TTL: str = ""
    DeregisterCriticalServiceAfter: str = ""
    Status: str = ""  # initial status; Consul defaults to "critical"
    Notes: str = ""


class ServiceRegistration(msgspec.Struct, omit_defaults=True):
    """Body of PUT /v1/agent/service/register."""

    Name: str
    ID: str = ""
    Address: str = ""
    Port: int = 0
    Tags: list[str] = msgspec.field(default_factory=list)
    Meta: dict[str, str] = msgspec.field(default_factory=dict)
    Check: ServiceCheck | None = None


class CatalogNode(msgspec.Struct):
    Node: str = ""
    Address: str = ""
    Datacenter: str = ""


class AgentService(msgspec.Struct):
    ID: str = ""
    Service: str = ""
    Tags: list[str] | None = None
    Address: str = ""
    Port: int = 0
    Meta: dict[str, str] | None = None


class HealthCheck(msgspec.Struct):
    CheckID: str = ""
    Status: str = ""
    ServiceID: str = ""
    Output: str = ""


class ServiceEntry(msgspec.Struct):
    """One element of GET /v1/health/service/:service."""

    Node: CatalogNode = msgspec.field(default_factory=CatalogNode)
    Service: AgentService = msgspec.field(default_factory=AgentService)
    Checks: list[HealthCheck] | None = None

    def address(self) -> str:
        """The service's address, falling back to its node's as Consul's docs say clients should."""
        return self.Service.Address or self.Node.Address


def meta_problems(meta: dict[str, str]) -> list[str]:
    """Why Consul would reject this service metadata (empty when it is valid)."""
    problems = []
    if len(meta) > META_MAX_KEYS:
        problems.append(f"{len(meta)} meta keys (Consul allows {META_MAX_KEYS})")
    for key, value in meta.items():
        if not key or len(key) > META_KEY_MAX_LEN or not set(key) <= META_KEY_CHARS:
            problems.append(f"meta key {key!r} is not [A-Za-z0-9_-]{{1,{META_KEY_MAX_LEN}}}")
        if key.lower().startswith("consul-"):
            problems.append(f"meta key {key!r} uses the reserved prefix 'consul-'")
        if len(value) > META_VALUE_MAX_LEN:
            problems.append(f"meta value of {key!r} is longer than {META_VALUE_MAX_LEN} characters")
    return problems


def go_duration(seconds: float) -> str:
    """Seconds as a Go duration string, the format Consul's wait/TTL fields take ("10s", "250ms")."""
    millis = round(seconds * 1000)
    if millis % 1000 == 0:
        return f"{millis // 1000}s"
    return f"{millis}ms"

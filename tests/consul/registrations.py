"""Service definitions for tests, built the way a regional node builds its own."""

from __future__ import annotations

from protocol.consul.wire import ServiceRegistration
from regional_node.discovery import ConsulRegistrationConfig, build_registration


def node_registration(
    node_id: str,
    *,
    region: str = "eu-west",
    jurisdiction: str = "EU",
    host: str = "127.0.0.1",
    port: int = 9001,
    models: tuple[tuple[str, str], ...] = (("meridian-small", "small"),),
    ttl_s: float = 10.0,
    deregister_critical_after_s: float = 60.0,
) -> ServiceRegistration:
    config = ConsulRegistrationConfig(ttl_s=ttl_s, deregister_critical_after_s=deregister_critical_after_s)
    return build_registration(
        config, node_id=node_id, region=region, jurisdiction=jurisdiction, host=host, port=port, models=models
    )

"""How a regional node makes itself known to the gateway's region directory (Consul)."""

from regional_node.discovery.consul_registration import (
    ConsulRegistration,
    ConsulRegistrationConfig,
    RegistrationError,
    build_registration,
)
from regional_node.discovery.presence import Presence, consul_presence

__all__ = [
    "ConsulRegistration",
    "ConsulRegistrationConfig",
    "Presence",
    "RegistrationError",
    "build_registration",
    "consul_presence",
]

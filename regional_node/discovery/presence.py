"""Wiring for the node app: be in Consul while the app runs, when the config has a `consul:` section."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from protocol.consul.advertisement import ModelVersionTag
from protocol.consul.client import ConsulClient
from regional_node.discovery.consul_registration import (
    ConsulRegistration,
    RegistrationError,
    build_registration,
)

if TYPE_CHECKING:
    from regional_node.probes import ProbeState
    from regional_node.server.config import NodeConfig


class Presence(Protocol):
    def readiness_changed(self) -> None: ...


class _Absent:
    """No `consul:` section: the node is listed in a static regions file instead."""

    def readiness_changed(self) -> None:
        return None


@contextlib.asynccontextmanager
async def consul_presence(
    config: NodeConfig,
    readiness: Callable[[], bool],
    probes: Callable[[], Mapping[str, ProbeState]] = dict,
) -> AsyncIterator[Presence]:
    """Registered (and heartbeating `readiness()`) inside the block; deregistered on the way out.
    The models failing their golden probes (`probes()`) are kept in the service's meta."""
    consul = config.consul
    if consul is None:
        yield _Absent()
        return
    if config.port == 0:
        raise RegistrationError(
            "consul: registration needs a fixed port (port 0 is only known after binding)"
        )
    # Here, not at the top: regional_node.server imports this package (as for NodeConfig above).
    from regional_node.server.checkpoint import checkpoint_hash

    registration = build_registration(
        consul,
        node_id=config.node_id,
        region=config.region,
        jurisdiction=config.jurisdiction,
        host=config.host,
        port=config.port,
        models=[(model.name, model.tier) for model in config.models],
        versions=[
            ModelVersionTag(model.name, model.version, checkpoint_hash(model.path))
            for model in config.models
            if model.version is not None
        ],
    )
    async with ConsulClient(consul) as client:
        presence = ConsulRegistration(
            client,
            registration,
            readiness,
            retry_max_s=consul.retry_max_s,
            failing_models=lambda: [name for name, state in probes().items() if state.failing],
        )
        await presence.start()
        try:
            yield presence
        finally:
            await presence.stop()

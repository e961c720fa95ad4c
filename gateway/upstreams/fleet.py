"""The fleet as one request sees it: directory membership overlaid with probes and ejections,
plus the Upstream that reaches each routing target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from gateway.discovery.interface import RegionDirectory
from gateway.health.ejection import Ejections
from gateway.health.probes import NodeProber
from gateway.upstreams.base import Upstream
from router.types import FleetSnapshot, ProviderInfo, Target


class ProviderSet(Protocol):
    """Commercial providers as the request path needs them; gateway.upstreams.providers builds the real one.

    `snapshot()` reports each provider with `healthy=False` while its circuit breaker is open.
    """

    def snapshot(self) -> tuple[ProviderInfo, ...]: ...

    def upstream(self, provider_id: str) -> Upstream: ...

    def route_label(self, provider_id: str) -> str:
        """x-meridian-route when this provider served, e.g. `provider=openai-us;fallback`."""
        ...

    async def aclose(self) -> None: ...


class NoProviders:
    """The embedded default: commercial fallback is off unless a providers section is configured."""

    def snapshot(self) -> tuple[ProviderInfo, ...]:
        return ()

    def upstream(self, provider_id: str) -> Upstream:
        raise KeyError(f"no provider {provider_id!r} is configured")

    def route_label(self, provider_id: str) -> str:
        return f"provider={provider_id}"

    async def aclose(self) -> None:
        return None


# (node_id, base_url) -> the Upstream that reaches it
NodeUpstreamFactory = Callable[[str, str], Upstream]


class Fleet:
    def __init__(
        self,
        directory: RegionDirectory,
        prober: NodeProber,
        ejections: Ejections,
        providers: ProviderSet,
        node_upstream: NodeUpstreamFactory,
    ) -> None:
        self.directory = directory
        self.prober = prober
        self.ejections = ejections
        self.providers = providers
        self._node_upstream = node_upstream
        self._upstreams: dict[tuple[str, str], Upstream] = {}

    def snapshot(self) -> FleetSnapshot:
        nodes = []
        for node in self.directory.snapshot():
            probe = self.prober.result(node.node_id)
            ready = probe is not None and probe.ready
            healthy = node.healthy and ready and self.ejections.available(node.node_id)
            load = probe.load if probe is not None else None
            nodes.append(dataclasses.replace(node, healthy=healthy, load=load or node.load))
        return FleetSnapshot(nodes=tuple(nodes), providers=self.providers.snapshot())

    def route_label(self, target: Target) -> str:
        """What x-meridian-route says about the target that served."""
        return self.providers.route_label(target.target_id) if target.kind == "provider" else target.reason

    def upstream_for(self, target: Target) -> Upstream:
        if target.kind == "provider":
            return self.providers.upstream(target.target_id)
        key = (target.target_id, target.url)
        upstream = self._upstreams.get(key)
        if upstream is None:
            upstream = self._upstreams[key] = self._node_upstream(target.target_id, target.url)
        return upstream

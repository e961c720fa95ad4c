"""The fleet as one request sees it: directory membership overlaid with probes and breakers,
plus the Upstream that reaches each routing target.

One rule for every target: a node is healthy when the directory lists it as such, its last probe
found it ready and its breaker is available; a provider when its breaker is available.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol

from gateway.discovery.interface import RegionDirectory
from gateway.health import BreakerBoard, BreakerConfig
from gateway.health.probes import NodeProber
from gateway.upstreams.base import Upstream
from router.types import FleetSnapshot, Prefill, ProviderInfo, Target


class ProviderSet(Protocol):
    """Commercial providers as the request path needs them; gateway.upstreams.providers builds the real one."""

    def snapshot(self) -> tuple[ProviderInfo, ...]:
        """The configured providers, before health (the fleet applies their breakers)."""
        ...

    def breaker_configs(self) -> Mapping[str, BreakerConfig]:
        """Each provider's own breaker settings, by provider id."""
        ...

    def upstream(self, provider_id: str) -> Upstream | None:
        """The provider's Upstream; None for an id that is no provider."""
        ...

    def route_label(self, provider_id: str) -> str | None:
        """x-meridian-route when this provider served, e.g. `provider=openai-us;fallback`; None
        for an id that is no provider."""
        ...

    async def aclose(self) -> None: ...


class NoProviders:
    """The embedded default: commercial fallback is off unless a providers section is configured."""

    def snapshot(self) -> tuple[ProviderInfo, ...]:
        return ()

    def breaker_configs(self) -> Mapping[str, BreakerConfig]:
        return {}

    def upstream(self, provider_id: str) -> Upstream | None:
        return None

    def route_label(self, provider_id: str) -> str | None:
        return None

    async def aclose(self) -> None:
        return None


# (node_id, base_url) -> the Upstream that reaches it
NodeUpstreamFactory = Callable[[str, str], Upstream]


class Fleet:
    def __init__(
        self,
        directory: RegionDirectory,
        prober: NodeProber,
        board: BreakerBoard,
        providers: ProviderSet,
        node_upstream: NodeUpstreamFactory,
    ) -> None:
        self.directory = directory
        self.prober = prober
        self.board = board
        self.providers = providers
        self._node_upstream = node_upstream
        self._upstreams: dict[tuple[str, str], Upstream] = {}
        # The last snapshot: (its inputs, the breakers' availability then, it).
        self._last: tuple[tuple[object, ...], tuple[tuple[bool, ...], ...], FleetSnapshot] | None = None
        # Providers bring their own breaker settings; every other target (a node) gets the board's.
        for provider_id, config in providers.breaker_configs().items():
            board.register(provider_id, config)

    def snapshot(self) -> FleetSnapshot:
        """The fleet as routing sees it now. Asked twice per request (admission, routing), and
        its inputs change only with a directory update, a probe or a breaker's state: while none
        has, the last snapshot is handed out again (the same objects, so what the router derives
        from a node's report is derived once)."""
        available = self.board.available
        directory, configured = self.directory.snapshot(), self.providers.snapshot()
        probes = tuple(self.prober.result(node.node_id) for node in directory)
        up = tuple(available(node.node_id) for node in directory)
        providers_up = tuple(available(p.provider_id) for p in configured)
        # Compared by identity: a probe result with the gateway's overlay is a new object each
        # time, and comparing reports field by field would cost more than building anew.
        inputs = (directory, configured, *probes)
        last = self._last
        if (
            last is not None
            and len(last[0]) == len(inputs)
            and all(a is b for a, b in zip(last[0], inputs, strict=True))
            and last[1] == (up, providers_up)
        ):
            return last[2]
        nodes = []
        for node, probe, node_up in zip(directory, probes, up, strict=True):
            ready = probe is not None and probe.ready
            load = probe.load if probe is not None else None
            nodes.append(
                dataclasses.replace(node, healthy=node.healthy and ready and node_up, load=load or node.load)
            )
        providers = tuple(
            p if p_up else dataclasses.replace(p, healthy=False)
            for p, p_up in zip(configured, providers_up, strict=True)
        )
        snapshot = FleetSnapshot(nodes=tuple(nodes), providers=providers)
        self._last = (inputs, (up, providers_up), snapshot)
        return snapshot

    def routed(self, target: Target, prefill: Prefill) -> None:
        """Note that a request was sent to `target` with this prefill (its route decision's), for
        the gateway's overlay (gateway/health/probes.py) until the node's reports show it."""
        self.prober.routed(target.target_id, prefill)

    def ejected(self) -> list[str]:
        """Ids of the directory's nodes whose breaker is open, sorted."""
        return sorted(n.node_id for n in self.directory.snapshot() if self.board.is_open(n.node_id))

    def probe_failed(self) -> dict[str, list[str]]:
        """By node id, the models its last /load says fail their golden probes (not routed there)."""
        failing = {}
        for node in self.directory.snapshot():
            probe = self.prober.result(node.node_id)
            if probe is not None and probe.load is not None and probe.load.probe_failed:
                failing[node.node_id] = sorted(probe.load.probe_failed)
        return failing

    def route_label(self, target: Target) -> str:
        """What x-meridian-route says about the target that served."""
        return self.providers.route_label(target.target_id) or target.reason

    def upstream_for(self, target: Target) -> Upstream:
        upstream = self.providers.upstream(target.target_id)
        if upstream is not None:
            return upstream
        key = (target.target_id, target.url)
        upstream = self._upstreams.get(key)
        if upstream is None:
            upstream = self._upstreams[key] = self._node_upstream(target.target_id, target.url)
        return upstream

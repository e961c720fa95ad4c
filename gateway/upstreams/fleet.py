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
from gateway.health.probes import NodeProber, ProbeResult
from gateway.upstreams.base import Upstream
from router.types import FleetSnapshot, NodeInfo, Prefill, ProviderInfo, RoutedStage, Target


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
        # The last snapshot, the providers' list and availability it was built from, and by node
        # id: the directory's entry, its probe, its breaker's availability, the NodeInfo built.
        self._last = FleetSnapshot(nodes=(), providers=())
        self._last_providers: tuple[tuple[ProviderInfo, ...], tuple[bool, ...]] | None = None
        self._built: dict[str, tuple[NodeInfo, ProbeResult | None, bool, NodeInfo]] = {}
        # Providers bring their own breaker settings; every other target (a node) gets the board's.
        for provider_id, config in providers.breaker_configs().items():
            board.register(provider_id, config)

    def snapshot(self) -> FleetSnapshot:
        """The fleet as routing sees it now. Asked twice per request (admission, routing). A node's
        entry changes only with a directory update, a probe, its breaker's state or a request
        routed to it (the overlay): each node's NodeInfo is rebuilt only when one of its own inputs
        changed (compared by identity), and while none has for any node the last snapshot is
        handed out again. So a request routed to one node of 64 rebuilds one entry, and what the
        router derives from an unchanged report is derived once."""
        available = self.board.available
        built, nodes = {}, []
        for node in self.directory.snapshot():
            probe, node_up = self.prober.result(node.node_id), available(node.node_id)
            last = self._built.get(node.node_id)
            if last is not None and last[0] is node and last[1] is probe and last[2] == node_up:
                info = last[3]
            else:
                ready = probe is not None and probe.ready
                load = probe.load if probe is not None else None
                info = dataclasses.replace(
                    node, healthy=node.healthy and ready and node_up, load=load or node.load
                )
            built[node.node_id] = (node, probe, node_up, info)
            nodes.append(info)
        configured = self.providers.snapshot()
        providers_up = tuple(available(p.provider_id) for p in configured)
        last, self._built = self._last, built
        if (
            len(nodes) == len(last.nodes)
            and all(a is b for a, b in zip(nodes, last.nodes, strict=True))
            and self._last_providers == (configured, providers_up)
        ):
            return last
        self._last_providers = (configured, providers_up)
        self._last = FleetSnapshot(
            nodes=tuple(nodes),
            providers=tuple(
                p if p_up else dataclasses.replace(p, healthy=False)
                for p, p_up in zip(configured, providers_up, strict=True)
            ),
        )
        return self._last

    def routed(self, target: Target, prefill: Prefill, request_id: str) -> None:
        """Note that a request was sent to `target` with this prefill (its route decision's), for
        the gateway's overlay (gateway/health/probes.py) until the node's reports show it."""
        self.prober.routed(target.target_id, prefill, key=_overlay_key(request_id, target))

    def answered(self, request_id: str, routed: Target, served: Target | None, *, ended: bool) -> None:
        """The request noted as routed to `routed` got its first answer from `served` (None:
        from no upstream), the whole answer if `ended` (else its first chunk). Only if that is
        `routed` is its prompt computed there; otherwise it left that node unanswered."""
        if served is not None and served.target_id == routed.target_id:
            stage: RoutedStage | None = "done" if ended else "running"
        else:
            stage = None
        self.prober.moved(routed.target_id, _overlay_key(request_id, routed), stage)

    def ended(self, request_id: str, target: Target) -> None:
        """The answer `target` was streaming for the request ended (finished, broke, or was
        closed): the node runs it no more."""
        self.prober.moved(target.target_id, _overlay_key(request_id, target), "done")

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


def _overlay_key(request_id: str, target: Target) -> str:
    """A call's requests on one node, told apart by model: an escalated `auto` request is routed
    to the small tier and then to the large one, which may share a node."""
    return f"{request_id}/{target.model}"

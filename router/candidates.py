"""Screening: which nodes and providers may serve a model for a tenant at all.

Residency is a hard rule applied here, before any preference, so nothing later in routing
(ordering, degrade, providers, retries) can ever see a target outside it. So is capability: a
target that does not serve everything the request asks (tools, structured output, ...;
protocol/capabilities.py) would only refuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from router.types import NodeInfo, ProviderInfo, Residency


class _Placed(Protocol):
    @property
    def region(self) -> str: ...
    @property
    def jurisdiction(self) -> str: ...
    @property
    def models(self) -> frozenset[str]: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def capabilities(self) -> frozenset[str]: ...


T = TypeVar("T", bound=_Placed)


@dataclass(frozen=True)
class Screening(Generic[T]):
    """The admitted targets and, for the unavailable reason, how many were turned away and why.

    Counts only targets that serve the model; each is counted under the first rule it fails, in
    the order residency, capability, exclusion, health: a target this request already failed on
    (and which that failure made unhealthy) is reported as tried, which is what happened.
    """

    admitted: tuple[T, ...]
    serving: int = 0
    outside_residency: int = 0
    # Inside the residency but without a capability the request needs.
    incapable: int = 0
    # What the targets inside the residency serve between them, whatever their health (collected
    # only for a request that asks for something).
    offered: frozenset[str] = frozenset()
    unhealthy: int = 0
    excluded: int = 0
    # Of the unhealthy: ids of those failing their golden probes for the model.
    probe_failed: tuple[str, ...] = ()


def screen(
    targets: Iterable[T],
    target_id: Callable[[T], str],
    *,
    model: str,
    residency: Residency,
    exclude: frozenset[str],
    needs: frozenset[str] = frozenset(),
    probe_failed: Callable[[T], bool] = lambda _: False,
) -> Screening[T]:
    """`needs`: the capabilities the request asks for. `probe_failed(target)`: the target fails
    its golden probes for `model` (unhealthy for it)."""
    admitted: list[T] = []
    seen: set[str] = set()
    failed: list[str] = []
    offered: set[str] = set()
    serving = outside = incapable = unhealthy = excluded = 0
    for target in targets:
        # A directory that lists one id twice must not make it two targets; the first entry wins.
        if model not in target.models or target_id(target) in seen:
            continue
        seen.add(target_id(target))
        serving += 1
        if not residency.allows(target.region, target.jurisdiction):
            outside += 1
            continue
        if needs:  # (most requests ask nothing beyond text: nothing to collect for them)
            offered |= target.capabilities
        if not needs <= target.capabilities:
            incapable += 1
        elif target_id(target) in exclude:
            excluded += 1
        elif probe_failed(target):  # first: a node failing its only model's probe is also not ready
            unhealthy += 1
            failed.append(target_id(target))
        elif not target.healthy:
            unhealthy += 1
        else:
            admitted.append(target)
    return Screening(
        tuple(admitted),
        serving=serving,
        outside_residency=outside,
        incapable=incapable,
        offered=frozenset(offered),
        unhealthy=unhealthy,
        excluded=excluded,
        probe_failed=tuple(failed),
    )


def screen_nodes(
    nodes: Iterable[NodeInfo],
    *,
    model: str,
    residency: Residency,
    exclude: frozenset[str],
    needs: frozenset[str] = frozenset(),
) -> Screening[NodeInfo]:
    return screen(
        nodes,
        lambda n: n.node_id,
        model=model,
        residency=residency,
        exclude=exclude,
        needs=needs,
        probe_failed=lambda n: n.load is not None and model in n.load.probe_failed,
    )


def screen_providers(
    providers: Iterable[ProviderInfo],
    *,
    model: str,
    residency: Residency,
    exclude: frozenset[str],
    needs: frozenset[str] = frozenset(),
) -> Screening[ProviderInfo]:
    return screen(
        providers, lambda p: p.provider_id, model=model, residency=residency, exclude=exclude, needs=needs
    )

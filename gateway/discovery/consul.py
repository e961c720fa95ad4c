"""The Consul region directory: the fleet is whatever Consul says is passing.

One watch task per datacenter runs blocking queries on /v1/health/service/meridian-node?passing,
so a membership change reaches routing as soon as Consul sees it (well under a second), while an
idle fleet costs one request per `wait_s`. When Consul cannot be reached, the directory keeps
serving the last membership it saw (stale but serving), says so once per outage in the log and in
`meridian_gateway_discovery_stale`, and resumes watching when Consul is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.config import ConsulDirectoryConfig
from protocol.consul.advertisement import MetaError, node_from_entry
from protocol.consul.client import ConsulClient, ConsulError, HealthResult, next_blocking_index
from router.types import ModelVersion, NodeInfo

logger = logging.getLogger(__name__)

_LOCAL_DC = ""  # key for "the agent's own datacenter" when `datacenters` is empty


class ConsulRegionDirectory:
    """RegionDirectory fed by Consul's passing instances of `config.service`."""

    def __init__(
        self,
        config: ConsulDirectoryConfig,
        *,
        registry: CollectorRegistry | None = None,
        client: ConsulClient | None = None,
    ) -> None:
        self._config = config
        self._client = client
        self._owns_client = client is None
        self._datacenters = config.datacenters or (_LOCAL_DC,)
        self._members: dict[str, tuple[NodeInfo, ...]] = {}
        self._snapshot: tuple[NodeInfo, ...] = ()
        self._failing: set[str] = set()
        self._reported_bad: set[str] = set()
        self._acl_warned = False
        self._synced = {dc: asyncio.Event() for dc in self._datacenters}
        self._tasks: list[asyncio.Task[None]] = []
        registry = registry if registry is not None else CollectorRegistry()
        self._stale = Gauge(
            "meridian_gateway_discovery_stale",
            "1 while some datacenter's Consul cannot be reached and routing uses its last membership.",
            registry=registry,
        )
        self._errors = Counter(
            "meridian_gateway_discovery_errors",
            "Failed Consul membership queries.",
            registry=registry,
        )

    @property
    def stale(self) -> bool:
        return bool(self._failing)

    @property
    def stale_datacenters(self) -> frozenset[str]:
        """Datacenters whose Consul cannot be reached right now ("" for the agent's own)."""
        return frozenset(self._failing)

    def snapshot(self) -> tuple[NodeInfo, ...]:
        return self._snapshot

    async def start(self) -> None:
        if self._client is None:
            self._client = ConsulClient(self._config)
        for dc in self._datacenters:
            self._tasks.append(asyncio.create_task(self._watch(dc), name=f"consul-watch-{dc or 'local'}"))
        # Come up with the fleet when Consul answers quickly; otherwise start stale and keep trying,
        # since a gateway that refuses to start during a Consul blip helps nobody.
        waits = [asyncio.create_task(event.wait()) for event in self._synced.values()]
        _, pending = await asyncio.wait(waits, timeout=self._config.initial_sync_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            logger.warning("Consul directory started without a first membership from every datacenter")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _watch(self, dc: str) -> None:
        assert self._client is not None
        loop = asyncio.get_running_loop()
        index, backoff = 0, self._config.backoff_initial_s
        while True:
            started = loop.time()
            try:
                result = await self._client.health_service(
                    self._config.service, datacenter=dc or None, passing=True, index=index
                )
            except ConsulError as exc:
                self._record_failure(dc, exc)
                # After an outage Consul may have restarted with other indexes: start over with a
                # non-blocking read so the first answer is the current membership.
                index = 0
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, self._config.backoff_max_s)
                continue
            except Exception:  # a bug must not end the watch silently
                logger.exception("Consul watch for datacenter %s failed unexpectedly", dc or "local")
                await asyncio.sleep(self._config.backoff_max_s)
                continue
            backoff = self._config.backoff_initial_s
            self._record_success(dc, result)
            index = next_blocking_index(index, result.index)
            elapsed = loop.time() - started
            if elapsed < self._config.min_interval_s:
                await asyncio.sleep(self._config.min_interval_s - elapsed)

    def _record_failure(self, dc: str, exc: ConsulError) -> None:
        self._errors.inc()
        if dc in self._failing:
            logger.debug("Consul still unreachable for datacenter %s: %s", dc or "local", exc)
            return
        self._failing.add(dc)
        self._stale.set(1)
        logger.warning(
            "Consul unreachable for datacenter %s (%s); routing on its last membership (%d nodes) until it returns",
            dc or "local",
            exc,
            len(self._members.get(dc, ())),
        )

    def _record_success(self, dc: str, result: HealthResult) -> None:
        if dc in self._failing:
            self._failing.discard(dc)
            logger.info("Consul reachable again for datacenter %s; membership watch resumed", dc or "local")
        self._stale.set(1 if self._failing else 0)
        if result.filtered_by_acls and not self._acl_warned:
            self._acl_warned = True
            logger.warning(
                "Consul hid some %s instances from this ACL token (needs service:read)", self._config.service
            )
        self._members[dc] = self._convert(result)
        self._rebuild()
        self._synced[dc].set()

    def _convert(self, result: HealthResult) -> tuple[NodeInfo, ...]:
        nodes = []
        for entry in result.entries:
            try:
                advert = node_from_entry(entry)
            except MetaError as exc:
                if entry.Service.ID not in self._reported_bad:  # once per instance, not per query
                    self._reported_bad.add(entry.Service.ID)
                    logger.warning("ignoring a Consul instance Meridian cannot route to: %s", exc)
                continue
            nodes.append(
                NodeInfo(
                    node_id=advert.node_id,
                    url=advert.url,
                    region=advert.region,
                    jurisdiction=advert.jurisdiction,
                    models=advert.models,
                    versions={t.name: ModelVersion(t.version, t.checkpoint) for t in advert.versions},
                )
            )
        return tuple(nodes)

    def _rebuild(self) -> None:
        seen: dict[str, NodeInfo] = {}
        for dc in self._datacenters:
            for node in self._members.get(dc, ()):
                seen.setdefault(node.node_id, node)
        # One tuple swap: snapshot() readers see either the old or the new membership, never a mix.
        self._snapshot = tuple(sorted(seen.values(), key=lambda node: node.node_id))

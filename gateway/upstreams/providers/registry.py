"""The configured commercial providers: their routing view and their (breaker-guarded) upstreams.

Built once at start-up by `build_providers` from the config's `providers:` section. With no
endpoints the registry is empty and no request ever leaves for a commercial API.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from gateway.health import BreakerBoard, BreakerMetrics, GuardedUpstream, RedisBreakerStore
from gateway.health.state import Clock
from gateway.upstreams.base import Upstream
from gateway.upstreams.providers.anthropic_adapter import AnthropicAdapter
from gateway.upstreams.providers.config import ProviderEntry, ProvidersConfig, resolve_api_keys
from gateway.upstreams.providers.metrics import ProviderMetrics
from gateway.upstreams.providers.openai_adapter import OpenAIAdapter
from router.types import ProviderInfo


class ProviderRegistry:
    def __init__(
        self,
        entries: Sequence[ProviderEntry],
        upstreams: Mapping[str, Upstream],
        board: BreakerBoard,
        *,
        owned_redis: Redis | None = None,
    ) -> None:
        self._entries = {entry.id: entry for entry in entries}
        self._upstreams = dict(upstreams)
        self.board = board
        self._owned_redis = owned_redis  # a client build_providers opened, closed with the registry

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entry(self, provider_id: str) -> ProviderEntry:
        return self._entries[provider_id]

    def snapshot(self) -> tuple[ProviderInfo, ...]:
        """The providers as routing sees them: healthy unless the breaker is open or a
        Retry-After is pending. Memory only, so it is cheap to call per request."""
        return tuple(
            ProviderInfo(
                provider_id=e.id,
                kind=e.kind,
                region=e.region,
                jurisdiction=e.jurisdiction,
                models=frozenset(e.models),
                healthy=self.board.available(e.id),
            )
            for e in self._entries.values()
        )

    def upstream(self, provider_id: str) -> Upstream:
        """The Upstream for a route target of kind "provider" (KeyError for an unknown id)."""
        return self._upstreams[provider_id]

    def served_models(self) -> frozenset[str]:
        """Logical models that providers serve as a configured model (`serve_as: model`)."""
        return frozenset(m for e in self._entries.values() if e.serve_as == "model" for m in e.models)

    def route_label(self, provider_id: str) -> str:
        """The x-meridian-route value when this provider served, e.g. `provider=openai-us;fallback`."""
        return f"provider={provider_id};{self._entries[provider_id].serve_as}"

    async def start(self) -> None:
        await self.board.start()

    async def aclose(self) -> None:
        await self.board.aclose()
        for upstream in self._upstreams.values():
            await upstream.aclose()
        if self._owned_redis is not None:
            await self._owned_redis.aclose()


def build_providers(
    config: ProvidersConfig,
    *,
    env: Mapping[str, str] | None = None,
    redis: Redis | None = None,
    redis_url: str | None = None,
    metrics_registry: CollectorRegistry | None = None,
    source: str = "<memory>",
    clock: Clock = time.time,
) -> ProviderRegistry:
    """The registry for the config's (already validated) `providers:` section.

    Breaker openings are shared across gateway replicas through Redis: the `redis` client
    (owned by the caller; a RedisCluster works too), else a client the registry opens (and
    closes) for the config's `redis_url`, else for `redis_url` here (the gateway passes the
    quota's). Without any, each replica keeps its own. `env` is where `api_key_env` names are
    looked up (os.environ by default); a configured provider whose variable is unset is a
    start-up error (ProviderConfigError naming `source` and the field). Opens no connection:
    the first breaker sync does.
    """
    keys = resolve_api_keys(config, env=env, source=source)
    owned: Redis | None = None
    url = config.redis_url or redis_url
    if redis is None and url and config.endpoints:
        timeout = config.store_timeout_s
        redis = owned = Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    store = (
        RedisBreakerStore(redis, timeout_s=config.store_timeout_s, clock=clock) if redis is not None else None
    )
    board = BreakerBoard(
        store=store,
        metrics=BreakerMetrics(metrics_registry) if metrics_registry is not None else None,
        clock=clock,
        sync_interval_s=config.sync_interval_s,
    )
    observer = (
        ProviderMetrics(metrics_registry, {e.id: e.kind for e in config.endpoints})
        if metrics_registry is not None
        else None
    )
    upstreams: dict[str, Upstream] = {}
    for entry in config.endpoints:
        board.register(entry.id, entry.breaker.to_config())
        adapter: Upstream = (
            OpenAIAdapter(entry, keys[entry.id])
            if entry.kind == "openai"
            else AnthropicAdapter(entry, keys[entry.id])
        )
        upstreams[entry.id] = GuardedUpstream(adapter, board, entry.id, observer=observer)
    return ProviderRegistry(config.endpoints, upstreams, board, owned_redis=owned)

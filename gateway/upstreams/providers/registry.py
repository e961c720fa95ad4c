"""The configured commercial providers: their routing view, breaker settings and upstreams.

Built once at start-up by `build_providers` from the config's `providers:` section. With no
section the registry is empty and no request ever leaves for a commercial API. Health is not
kept here: each provider's breaker lives on the gateway's one BreakerBoard, with the settings
`breaker_configs()` gives it.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from gateway.health import BreakerConfig
from gateway.upstreams.base import Upstream
from gateway.upstreams.providers.anthropic_adapter import AnthropicAdapter
from gateway.upstreams.providers.config import ProviderEntry, ProvidersConfig, resolve_api_keys
from gateway.upstreams.providers.metrics import ObservedUpstream, ProviderMetrics
from gateway.upstreams.providers.openai_adapter import OpenAIAdapter
from protocol.capabilities import ALL_CAPABILITIES, Capability
from router.types import ProviderInfo

# What each kind of provider serves beyond text (protocol/capabilities.py), which routing matches
# against what a request asks: an OpenAI(-compatible) API gets every field as the client sent it
# (one that lacks a feature answers its own 400); the Anthropic adapter translates tool calling
# (gateway/translate/openai_to_anthropic.py) and refuses the rest, which Messages cannot express.
CAPABILITIES: dict[str, frozenset[Capability]] = {
    "openai": ALL_CAPABILITIES,
    "anthropic": frozenset({"tools"}),
}


class ProviderRegistry:
    def __init__(self, section: ProvidersConfig, upstreams: Mapping[str, Upstream]) -> None:
        self.section = section  # also says where breaker marks are shared (redis_url, intervals)
        self._entries = {entry.id: entry for entry in section.endpoints}
        self._upstreams = dict(upstreams)
        # Routing's view before health; the fleet marks the ones whose breaker is unavailable.
        self._infos = tuple(
            ProviderInfo(
                provider_id=e.id,
                kind=e.kind,
                region=e.region,
                jurisdiction=e.jurisdiction,
                models=frozenset(e.models),
                capabilities=CAPABILITIES[e.kind],
            )
            for e in section.endpoints
        )

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entry(self, provider_id: str) -> ProviderEntry:
        return self._entries[provider_id]

    def snapshot(self) -> tuple[ProviderInfo, ...]:
        return self._infos

    def breaker_configs(self) -> dict[str, BreakerConfig]:
        """Each provider's own breaker settings (its `breaker:` entry), by provider id."""
        return {e.id: e.breaker.to_config() for e in self._entries.values()}

    def upstream(self, provider_id: str) -> Upstream | None:
        """The Upstream of a configured provider; None for any other id."""
        return self._upstreams.get(provider_id)

    def served_models(self) -> frozenset[str]:
        """Logical models that providers serve as a configured model (`serve_as: model`)."""
        return frozenset(m for e in self._entries.values() if e.serve_as == "model" for m in e.models)

    def route_label(self, provider_id: str) -> str | None:
        """The x-meridian-route value when this provider served, e.g. `provider=openai-us;fallback`
        (None for an id that is no provider)."""
        entry = self._entries.get(provider_id)
        return None if entry is None else f"provider={provider_id};{entry.serve_as}"

    async def aclose(self) -> None:
        for upstream in self._upstreams.values():
            await upstream.aclose()


def build_providers(
    config: ProvidersConfig,
    *,
    env: Mapping[str, str] | None = None,
    metrics_registry: CollectorRegistry | None = None,
    source: str = "<memory>",
) -> ProviderRegistry:
    """The registry for the config's (already validated) `providers:` section.

    `env` is where `api_key_env` names are looked up (os.environ by default); a configured
    provider whose variable is unset is a start-up error (ProviderConfigError naming `source` and
    the field). Opens no connection.
    """
    parsed = config
    keys = resolve_api_keys(parsed, env=env, source=source)
    metrics = (
        ProviderMetrics(metrics_registry, {e.id: e.kind for e in parsed.endpoints})
        if metrics_registry is not None
        else None
    )
    upstreams: dict[str, Upstream] = {}
    for entry in parsed.endpoints:
        adapter: Upstream = (
            OpenAIAdapter(entry, keys[entry.id])
            if entry.kind == "openai"
            else AnthropicAdapter(entry, keys[entry.id])
        )
        upstreams[entry.id] = ObservedUpstream(adapter, entry.id, metrics)
    return ProviderRegistry(parsed, upstreams)

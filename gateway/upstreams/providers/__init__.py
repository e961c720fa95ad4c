"""Commercial API providers (OpenAI, Anthropic) as Upstreams behind circuit breakers."""

from gateway.upstreams.providers.anthropic_adapter import AnthropicAdapter
from gateway.upstreams.providers.config import (
    ProviderConfigError,
    ProviderEntry,
    ProvidersConfig,
    ProviderTimeouts,
)
from gateway.upstreams.providers.errors import ProviderError
from gateway.upstreams.providers.openai_adapter import OpenAIAdapter
from gateway.upstreams.providers.registry import ProviderRegistry, build_providers

__all__ = [
    "AnthropicAdapter",
    "OpenAIAdapter",
    "ProviderConfigError",
    "ProviderEntry",
    "ProviderError",
    "ProviderRegistry",
    "ProviderTimeouts",
    "ProvidersConfig",
    "build_providers",
]

"""Commercial API providers (OpenAI, Anthropic) as Upstreams behind circuit breakers."""

from gateway.providers.anthropic_adapter import AnthropicAdapter
from gateway.providers.config import (
    ProviderConfigError,
    ProviderEntry,
    ProvidersSection,
    ProviderTimeouts,
    parse_providers,
)
from gateway.providers.errors import ProviderError
from gateway.providers.openai_adapter import OpenAIAdapter
from gateway.providers.registry import ProviderRegistry, build_providers

__all__ = [
    "AnthropicAdapter",
    "OpenAIAdapter",
    "ProviderConfigError",
    "ProviderEntry",
    "ProviderError",
    "ProviderRegistry",
    "ProviderTimeouts",
    "ProvidersSection",
    "build_providers",
    "parse_providers",
]

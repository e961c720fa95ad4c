"""The `providers:` section: validation that names the field, and the registry it builds."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError
from gateway.upstreams.providers import AnthropicAdapter, OpenAIAdapter, ProviderConfigError, build_providers
from gateway.upstreams.providers.metrics import ObservedUpstream
from tests.support.gateway_config import gateway_config

ENTRY: dict[str, Any] = {
    "id": "anthropic-eu",
    "kind": "anthropic",
    "base_url": "https://api.anthropic.example",
    "api_key_env": "ANTHROPIC_KEY_FOR_TEST",
    "region": "eu-west",
    "jurisdiction": "EU",
    "models": {"small": "claude-haiku", "large": "claude-sonnet"},
    "serve_as": "model",
}
ENV = {"ANTHROPIC_KEY_FOR_TEST": "sk-ant"}


def build(entries: list[dict[str, Any]], env: dict[str, str] = ENV) -> Any:
    """As the gateway starts: the config file validated (ConfigError), then the registry built
    (ProviderConfigError for an unset key variable)."""
    config = gateway_config(providers={"endpoints": entries}, source="gateway.yaml")
    return build_providers(config.providers, env=env, source=config.source)


@pytest.mark.parametrize("section", [{}, {"providers": None}])
async def test_no_section_means_no_providers(section: dict[str, Any]) -> None:
    registry = build_providers(gateway_config(**section).providers)
    assert not registry and registry.snapshot() == ()


async def test_entry_becomes_provider_info_and_guarded_upstream() -> None:
    openai = {**ENTRY, "id": "openai-us", "kind": "openai", "region": "us-east", "jurisdiction": "US",
              "serve_as": "fallback", "base_url": "https://api.openai.example/v1"}  # fmt: skip
    registry = build([ENTRY, openai])
    try:
        infos = {p.provider_id: p for p in registry.snapshot()}
        eu = infos["anthropic-eu"]
        assert (eu.kind, eu.region, eu.jurisdiction, eu.healthy) == ("anthropic", "eu-west", "EU", True)
        assert eu.models == frozenset({"small", "large"})
        upstream = registry.upstream("anthropic-eu")
        assert isinstance(upstream, ObservedUpstream) and isinstance(upstream.inner, AnthropicAdapter)
        assert isinstance(registry.upstream("openai-us").inner, OpenAIAdapter)  # type: ignore[attr-defined]
        assert registry.route_label("openai-us") == "provider=openai-us;fallback"
        assert registry.route_label("anthropic-eu") == "provider=anthropic-eu;model"
        assert registry.served_models() == frozenset({"small", "large"})
    finally:
        await registry.aclose()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kind": "gemini"}, "$.providers.endpoints[0].kind"),
        ({"base_url": "api.anthropic.com"}, "$.providers.endpoints[0].base_url"),
        ({"models": {}}, "$.providers.endpoints[0].models"),
        ({"serve_as": "primary"}, "$.providers.endpoints[0].serve_as"),
        ({"timeouts": {"idle_s": 0}}, "$.providers.endpoints[0].timeouts.idle_s"),
        ({"timeouts": {"idle": 3}}, "$.providers.endpoints[0].timeouts"),
        ({"breaker": {"failure_rate": 2}}, "$.providers.endpoints[0].breaker"),
        ({"api_key": "sk-inline"}, "$.providers.endpoints[0]"),  # keys never go in YAML
        ({"id": "bad id"}, "$.providers.endpoints[0].id"),
    ],
)
def test_invalid_entries_name_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        build([{**ENTRY, **change}])
    assert str(info.value).startswith(f"gateway.yaml: {field}")


def test_missing_required_field_is_named() -> None:
    entry = {k: v for k, v in ENTRY.items() if k != "region"}
    with pytest.raises(ConfigError, match=r"endpoints\[0\].*region"):
        build([entry])


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"endpoints\[1\]\.id: duplicate"):
        build([ENTRY, ENTRY])


def test_unset_key_variable_is_a_start_up_error() -> None:
    with pytest.raises(ProviderConfigError, match=r"endpoints\[0\]\.api_key_env: .*ANTHROPIC_KEY_FOR_TEST"):
        build([ENTRY], env={})


def test_a_key_with_a_line_break_inside_is_a_start_up_error_and_a_trailing_one_is_dropped() -> None:
    # The key goes into a request header, where a line break would end it early.
    with pytest.raises(ProviderConfigError, match=r"endpoints\[0\]\.api_key_env: .*line break"):
        build([ENTRY], env={"ANTHROPIC_KEY_FOR_TEST": "sk-ant\r\nx-injected: 1"})
    assert build([ENTRY], env={"ANTHROPIC_KEY_FOR_TEST": "sk-ant\n"})  # as read from a secrets file

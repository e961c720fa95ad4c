"""Fixtures for provider tests: fake OpenAI and Anthropic servers and provider entries for them,
and a real node for the tests that compare a provider-free path with the node's own answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.upstreams.providers import ProvidersConfig
from tests.gateway.conftest import NodeProcess, start_nodes
from tests.support.fake_providers import FakeProvider, running


@pytest.fixture(scope="module")
def node(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A real node ("us-1", us-east, jurisdiction us) serving the tiny Llama checkpoint as `tiny`."""
    process = NodeProcess(
        "us-1", "us-east", "us", {"tiny": (llama_checkpoint, "small")}, tmp_path_factory.mktemp("node-logs")
    )
    start_nodes([process])
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def fake_openai() -> Iterator[FakeProvider]:
    with running(FakeProvider("openai", api_key="sk-openai-test")) as provider:
        yield provider


@pytest.fixture
def fake_anthropic() -> Iterator[FakeProvider]:
    with running(FakeProvider("anthropic", api_key="sk-ant-test")) as provider:
        yield provider


def provider_entry(fake: FakeProvider, provider_id: str, **overrides: Any) -> dict[str, Any]:
    """A `providers.endpoints[]` entry (as YAML would give it) pointing at a fake server."""
    entry: dict[str, Any] = {
        "id": provider_id,
        "kind": fake.kind,
        "base_url": fake.base_url,
        "api_key_env": f"TEST_{provider_id.upper().replace('-', '_')}_KEY",
        "region": "us-east",
        "jurisdiction": "US",
        "models": {"tiny": f"{fake.kind}-model-1"},
        "timeouts": {"connect_s": 2.0, "first_byte_s": 5.0, "idle_s": 5.0},
        "breaker": {"min_calls": 2, "failure_rate": 0.5, "cooldown_s": 0.3, "window_s": 10},
    }
    entry.update(overrides)
    return entry


def env_for(fake: FakeProvider, entry: dict[str, Any]) -> dict[str, str]:
    return {entry["api_key_env"]: fake.api_key}


def providers_config(section: dict[str, Any]) -> ProvidersConfig:
    """A `providers:` section (as YAML would give it), validated."""
    return msgspec.convert(section, ProvidersConfig)

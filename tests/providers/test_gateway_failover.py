"""Through the real gateway: providers serve when the fleet cannot, fail over to each other, are
skipped while their breaker is open, and never serve outside a tenant's residency."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import RunningGateway
from tests.providers.conftest import provider_entry
from tests.providers.gateway_harness import EU_KEY, PRIVATE_KEY, US_KEY, dead_node, running_gateway
from tests.support.fake_providers import FakeProvider, Fault

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}


def us(fake: FakeProvider, provider_id: str, **overrides: Any) -> dict[str, Any]:
    return provider_entry(fake, provider_id, jurisdiction="us", **overrides)


@pytest.fixture
def two_providers(
    tmp_path: Path, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> Iterator[RunningGateway]:
    # Providers are ordered by id within a preference class: "a-openai" is tried first.
    breaker = {"min_calls": 2, "failure_rate": 0.5, "cooldown_s": 30}
    entries = [
        us(fake_openai, "a-openai", breaker=breaker),
        us(fake_anthropic, "b-anthropic", breaker=breaker),
    ]
    env = {entries[0]["api_key_env"]: fake_openai.api_key, entries[1]["api_key_env"]: fake_anthropic.api_key}
    nodes = [dead_node("us-1", "us-east", "us")]
    with running_gateway(tmp_path, providers=entries, nodes=nodes, env=env) as gateway:
        yield gateway


def chat(gateway: RunningGateway, key: str, body: dict[str, Any] = CHAT) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=20,
    )


def test_fleet_down_a_provider_serves_and_the_route_header_says_so(
    two_providers: RunningGateway, fake_openai: FakeProvider
) -> None:
    response = chat(two_providers, US_KEY)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == fake_openai.reply
    assert response.json()["model"] == "tiny"
    assert response.headers["x-meridian-route"].startswith("provider=a-openai;fallback")


def test_failing_provider_fails_over_to_the_next_provider(
    two_providers: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(status=503))
    response = chat(two_providers, US_KEY)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == fake_anthropic.reply
    assert response.headers["x-meridian-route"].startswith("provider=b-anthropic;fallback")


def test_streaming_fails_over_before_the_first_byte(
    two_providers: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(status=429, retry_after="30"))
    with httpx.stream(
        "POST",
        f"{two_providers.url}/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={"authorization": f"Bearer {US_KEY}"},
        timeout=20,
    ) as response:
        assert response.status_code == 200
        body = response.read().decode()
    assert "data: [DONE]" in body
    assert "fake" in body and len(fake_anthropic.requests) == 1


def test_open_breaker_skips_the_provider_without_calling_it(
    two_providers: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    fake_openai.always(Fault(status=500))
    for _ in range(2):  # min_calls 2 at 50%: a-openai opens
        assert chat(two_providers, US_KEY).status_code == 200
    calls = len(fake_openai.requests)
    response = chat(two_providers, US_KEY)
    assert response.status_code == 200
    assert response.headers["x-meridian-route"].startswith("provider=b-anthropic")
    assert len(fake_openai.requests) == calls
    metrics = httpx.get(f"{two_providers.admin_url}/metrics", timeout=10).text
    assert 'meridian_breaker_state{target="a-openai"} 2.0' in metrics
    assert 'meridian_breaker_state{target="b-anthropic"} 0.0' in metrics
    assert (
        'meridian_provider_errors_total{error="server_error",kind="openai",provider="a-openai"} 2.0'
        in metrics
    )


def test_tenant_without_commercial_permission_is_never_served_by_a_provider(
    two_providers: RunningGateway, fake_openai: FakeProvider, fake_anthropic: FakeProvider
) -> None:
    response = chat(two_providers, PRIVATE_KEY)
    assert response.status_code == 503
    assert not fake_openai.requests and not fake_anthropic.requests


def test_eu_tenant_is_never_sent_to_a_us_provider(tmp_path: Path, fake_openai: FakeProvider) -> None:
    entry = us(fake_openai, "openai-us")
    nodes = [dead_node("eu-1", "eu-west", "eu")]
    env = {entry["api_key_env"]: fake_openai.api_key}
    with running_gateway(tmp_path, providers=[entry], nodes=nodes, env=env) as gateway:
        response = chat(gateway, EU_KEY)
        assert response.status_code == 503
        assert chat(gateway, US_KEY).status_code == 200  # the provider itself is fine
    assert len(fake_openai.requests) == 1


def test_eu_tenant_may_use_an_eu_provider(tmp_path: Path, fake_anthropic: FakeProvider) -> None:
    entry = provider_entry(fake_anthropic, "anthropic-eu", region="eu-west", jurisdiction="eu")
    env = {entry["api_key_env"]: fake_anthropic.api_key}
    with running_gateway(
        tmp_path, providers=[entry], nodes=[dead_node("eu-1", "eu-west", "eu")], env=env
    ) as gw:
        response = chat(gw, EU_KEY)
    assert response.status_code == 200, response.text
    assert response.headers["x-meridian-region"] == "eu-west"

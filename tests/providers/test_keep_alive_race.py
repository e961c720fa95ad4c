"""Provider connections and the keep-alive race: a request written on a pooled connection just as
the provider closed it as idle is sent once more on a new connection, and is never held against
the provider. The race is made certain by a proxy whose idle close wins against every reused
connection (tests/support/idle_closer.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from gateway.health import BreakerState
from gateway.upstreams.providers import AnthropicAdapter, OpenAIAdapter, ProviderEntry
from tests.providers.conftest import provider_entry
from tests.providers.gateway_harness import US_KEY, dead_node, running_gateway
from tests.support.chunks import as_wire
from tests.support.fake_providers import FakeProvider
from tests.support.idle_closer import IdleCloser, idle_closer

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 50}


def through(proxy: IdleCloser, fake: FakeProvider, provider_id: str, **overrides: Any) -> dict[str, Any]:
    """A provider entry for `fake`, reached through `proxy`."""
    entry = provider_entry(fake, provider_id, jurisdiction="us", **overrides)
    entry["base_url"] = fake.base_url.replace(f":{fake.port}", f":{proxy.port}")
    return entry


@pytest.fixture
def openai_proxy(fake_openai: FakeProvider) -> Iterator[IdleCloser]:
    with idle_closer(fake_openai.port, close_after_s=0.0) as proxy:
        yield proxy


@pytest.fixture
def anthropic_proxy(fake_anthropic: FakeProvider) -> Iterator[IdleCloser]:
    with idle_closer(fake_anthropic.port, close_after_s=0.0) as proxy:
        yield proxy


@pytest.fixture
async def openai(fake_openai: FakeProvider, openai_proxy: IdleCloser) -> AsyncIterator[OpenAIAdapter]:
    entry = msgspec.convert(through(openai_proxy, fake_openai, "openai-us"), ProviderEntry)
    adapter = OpenAIAdapter(entry, fake_openai.api_key)
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def anthropic(
    fake_anthropic: FakeProvider, anthropic_proxy: IdleCloser
) -> AsyncIterator[AnthropicAdapter]:
    entry = msgspec.convert(through(anthropic_proxy, fake_anthropic, "anthropic-us"), ProviderEntry)
    adapter = AnthropicAdapter(entry, fake_anthropic.api_key)
    yield adapter
    await adapter.aclose()


async def test_a_completion_that_meets_an_idle_close_is_sent_again_on_a_new_connection(
    openai: OpenAIAdapter, openai_proxy: IdleCloser, fake_openai: FakeProvider
) -> None:
    for _ in range(3):
        result = as_wire(await openai.complete("chat", CHAT, {}))
        assert result["choices"][0]["message"]["content"] == fake_openai.reply
    assert openai_proxy.raced == 2  # the second and third met a closing connection first
    assert len(fake_openai.requests) == 3  # each reached the provider exactly once


async def test_a_stream_that_meets_an_idle_close_is_sent_again_on_a_new_connection(
    anthropic: AnthropicAdapter, anthropic_proxy: IdleCloser, fake_anthropic: FakeProvider
) -> None:
    for _ in range(3):
        async with anthropic.stream("chat", {**CHAT, "stream": True}, {}) as chunks:
            text = "".join([c.choices[0].content() async for c in chunks if c.choices])
        assert text == fake_anthropic.reply
    assert anthropic_proxy.raced == 2
    assert len(fake_anthropic.requests) == 3


def test_a_raced_provider_request_is_served_and_not_counted_as_a_provider_failure(
    tmp_path: Path, fake_openai: FakeProvider, openai_proxy: IdleCloser
) -> None:
    entry = through(openai_proxy, fake_openai, "openai-us", breaker={"min_calls": 1, "cooldown_s": 30})
    env = {entry["api_key_env"]: fake_openai.api_key}
    with running_gateway(
        tmp_path, providers=[entry], nodes=[dead_node("us-1", "us-east", "us")], env=env
    ) as gateway:
        for stream in (False, True, False):
            response = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                json={**CHAT, "stream": stream},
                headers={"authorization": f"Bearer {US_KEY}"},
                timeout=20,
            )
            assert response.status_code == 200, response.text
            assert response.headers["x-meridian-route"].startswith("provider=openai-us")
        assert openai_proxy.raced == 2
        assert gateway.gateway.board.state("openai-us") is BreakerState.CLOSED
        attempts = "meridian_gateway_upstream_attempts_total"
        assert gateway.metric(attempts, target="openai-us", region="us-east", outcome="ok") == 3
        assert gateway.metric(attempts, target="openai-us", region="us-east", outcome="retryable") == 0
        metrics = httpx.get(f"{gateway.admin_url}/metrics", timeout=10).text
        assert "meridian_provider_errors_total{" not in metrics

"""The Anthropic adapter against a fake Messages API that speaks the real wire format."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from gateway.upstreams.providers import AnthropicAdapter, ProviderEntry, ProviderError
from tests.providers.conftest import provider_entry
from tests.support.chunks import as_wire
from tests.support.fake_providers import FakeProvider, Fault

CHAT = {
    "model": "tiny",
    "messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Say hello"}],
}


@pytest.fixture
async def adapter(fake_anthropic: FakeProvider) -> AsyncIterator[AnthropicAdapter]:
    entry = msgspec.convert(
        provider_entry(fake_anthropic, "anthropic-us", default_max_tokens=64), ProviderEntry
    )
    adapter = AnthropicAdapter(entry, fake_anthropic.api_key)
    yield adapter
    await adapter.aclose()


async def test_request_is_a_messages_request_with_key_and_version(
    adapter: AnthropicAdapter, fake_anthropic: FakeProvider
) -> None:
    await adapter.complete("chat", {**CHAT, "stop": ["zzz"]}, {"x-meridian-tenant": "t"})
    sent = fake_anthropic.requests[-1]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "x-meridian-tenant" not in sent.headers
    assert sent.body["model"] == "anthropic-model-1"
    assert sent.body["system"] == "Be kind."
    assert sent.body["messages"] == [{"role": "user", "content": "Say hello"}]
    assert sent.body["max_tokens"] == 64  # from config: the request had none
    assert sent.body["stop_sequences"] == ["zzz"]


async def test_complete_translates_the_answer(
    adapter: AnthropicAdapter, fake_anthropic: FakeProvider
) -> None:
    result = as_wire(await adapter.complete("chat", {**CHAT, "max_tokens": 3}, {}))
    choice = result["choices"][0]
    assert choice["message"]["content"] == "Hello from the"
    assert choice["finish_reason"] == "length"
    assert result["model"] == "tiny" and result["object"] == "chat.completion"
    usage = result["usage"]
    assert usage["completion_tokens"] == 3
    assert usage["prompt_tokens_details"]["cached_tokens"] == 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3


async def test_stop_sequence_maps_to_stop(adapter: AnthropicAdapter) -> None:
    result = as_wire(await adapter.complete("chat", {**CHAT, "stop": ["provider"]}, {}))
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["choices"][0]["message"]["content"] == "Hello from the fake"


async def test_stream_becomes_openai_chunks(adapter: AnthropicAdapter, fake_anthropic: FakeProvider) -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    async with adapter.stream("chat", body, {}) as chunks:
        items = [as_wire(chunk) async for chunk in chunks]
    assert fake_anthropic.requests[-1].body["stream"] is True
    assert items[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in items if c["choices"])
    assert text == fake_anthropic.reply
    assert [c["choices"][0]["finish_reason"] for c in items if c["choices"]][-1] == "stop"
    assert items[-1]["usage"]["completion_tokens"] == len(fake_anthropic.reply.split(" "))


async def test_overloaded_maps_to_retryable_503(
    adapter: AnthropicAdapter, fake_anthropic: FakeProvider
) -> None:
    fake_anthropic.fail_next(Fault(status=529))
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", CHAT, {})
    assert info.value.retryable and info.value.status_code == 503


async def test_invalid_request_goes_back_to_the_client(
    adapter: AnthropicAdapter, fake_anthropic: FakeProvider
) -> None:
    fake_anthropic.fail_next(Fault(status=400))
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", CHAT, {})
    assert not info.value.retryable and info.value.status_code == 400
    assert info.value.body is not None
    assert info.value.body["error"]["message"].startswith("invalid_request_error")


async def test_rate_limit_carries_retry_after(
    adapter: AnthropicAdapter, fake_anthropic: FakeProvider
) -> None:
    fake_anthropic.fail_next(Fault(status=429, retry_after="12"))
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", CHAT, {})
    assert info.value.status_code == 429 and info.value.retry_after == 12.0


async def test_error_event_midstream_raises(adapter: AnthropicAdapter, fake_anthropic: FakeProvider) -> None:
    fake_anthropic.fail_next(Fault(error_event="overloaded_error"))
    received = []
    with pytest.raises(ProviderError) as info:
        async with adapter.stream("chat", CHAT, {}) as chunks:
            async for chunk in chunks:
                received.append(chunk)
    assert len(received) == 3  # the role chunk and two deltas
    assert info.value.retryable and info.value.status_code == 503


async def test_stream_cut_midway_is_broken(adapter: AnthropicAdapter, fake_anthropic: FakeProvider) -> None:
    fake_anthropic.fail_next(Fault(cut_after=5))
    with pytest.raises(ProviderError) as info:
        async with adapter.stream("chat", CHAT, {}) as chunks:
            async for _ in chunks:
                pass
    assert info.value.retryable and info.value.kind == "stream_broken"


async def test_legacy_completions_are_unsupported(adapter: AnthropicAdapter) -> None:
    with pytest.raises(ProviderError) as info:
        await adapter.complete("completions", {"model": "tiny", "prompt": "x"}, {})
    assert info.value.kind == "unsupported" and info.value.retryable

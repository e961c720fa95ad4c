"""The OpenAI adapter against a fake OpenAI server that speaks the real wire format."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
import pytest

from gateway.upstreams.providers import OpenAIAdapter, ProviderEntry, ProviderError
from tests.providers.conftest import provider_entry
from tests.support.chunks import as_wire
from tests.support.fake_providers import FakeProvider, Fault

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 50}


@pytest.fixture
async def adapter(fake_openai: FakeProvider) -> AsyncIterator[OpenAIAdapter]:
    entry = msgspec.convert(provider_entry(fake_openai, "openai-us"), ProviderEntry)
    adapter = OpenAIAdapter(entry, fake_openai.api_key)
    yield adapter
    await adapter.aclose()


@pytest.fixture
async def impatient(fake_openai: FakeProvider) -> AsyncIterator[OpenAIAdapter]:
    """Short first-byte and idle timeouts (0.5 s), for the tests that make the server slow."""
    timeouts = {"connect_s": 1.0, "first_byte_s": 0.5, "idle_s": 0.5}
    entry = msgspec.convert(provider_entry(fake_openai, "openai-us", timeouts=timeouts), ProviderEntry)
    adapter = OpenAIAdapter(entry, fake_openai.api_key)
    yield adapter
    await adapter.aclose()


async def test_complete_maps_model_sends_key_and_strips_extensions(
    adapter: OpenAIAdapter, fake_openai: FakeProvider
) -> None:
    body = {**CHAT, "top_k": 5, "return_token_ids": True, "stream_options": {"include_usage": True}}
    result = as_wire(await adapter.complete("chat", body, {"x-request-id": "r1", "x-meridian-tenant": "t"}))
    assert result["choices"][0]["message"]["content"] == fake_openai.reply
    assert result["model"] == "tiny"  # the client's name, not the provider's
    assert result["usage"]["completion_tokens"] == len(fake_openai.reply.split(" "))
    sent = fake_openai.requests[-1]
    assert sent.body["model"] == "openai-model-1"
    assert (
        "top_k" not in sent.body and "return_token_ids" not in sent.body and "stream_options" not in sent.body
    )
    assert sent.headers["authorization"] == "Bearer sk-openai-test"
    assert sent.headers["x-request-id"] == "r1"
    assert "x-meridian-tenant" not in sent.headers  # internal headers never leave


async def test_stream_yields_chunks_and_usage(adapter: OpenAIAdapter, fake_openai: FakeProvider) -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    async with adapter.stream("chat", body, {}) as chunks:
        items = [as_wire(chunk) async for chunk in chunks]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in items if c["choices"])
    assert text == fake_openai.reply
    assert items[-1]["usage"]["completion_tokens"] > 0
    assert all(c["model"] == "tiny" for c in items)


async def test_client_error_is_not_retryable_and_keeps_the_body(
    adapter: OpenAIAdapter, fake_openai: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(status=400))
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", CHAT, {})
    assert not info.value.retryable and info.value.status_code == 400
    assert info.value.body is not None and info.value.body["error"]["message"] == "injected HTTP 400"


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retryable(
    adapter: OpenAIAdapter, fake_openai: FakeProvider, status: int
) -> None:
    fake_openai.fail_next(Fault(status=status))
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", CHAT, {})
    assert info.value.retryable and info.value.kind == "server_error"


async def test_rate_limit_is_retryable_with_retry_after(
    adapter: OpenAIAdapter, fake_openai: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(status=429, retry_after="7"))
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", CHAT, {})
    assert info.value.retryable and info.value.status_code == 429 and info.value.retry_after == 7.0


async def test_wrong_key_is_a_deployment_fault_not_the_clients(fake_openai: FakeProvider) -> None:
    entry = msgspec.convert(provider_entry(fake_openai, "openai-us"), ProviderEntry)
    adapter = OpenAIAdapter(entry, "sk-wrong")
    try:
        with pytest.raises(ProviderError) as info:
            await adapter.complete("chat", CHAT, {})
    finally:
        await adapter.aclose()
    assert info.value.retryable and info.value.status_code == 502 and info.value.kind == "credentials"


async def test_slow_first_byte_times_out(impatient: OpenAIAdapter, fake_openai: FakeProvider) -> None:
    fake_openai.fail_next(Fault(first_byte_delay_s=1.5))
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        await impatient.complete("chat", CHAT, {})
    assert info.value.kind == "timeout" and info.value.retryable
    assert time.monotonic() - started < 1.4


async def test_stream_cut_midway_raises_retryable_error(
    adapter: OpenAIAdapter, fake_openai: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(cut_after=4))
    received = []
    with pytest.raises(ProviderError) as info:
        async with adapter.stream("chat", CHAT, {}) as chunks:
            async for chunk in chunks:
                received.append(chunk)
    assert received, "the chunks before the cut arrive"
    assert info.value.retryable and info.value.kind == "stream_broken"


async def test_stream_stalled_between_chunks_hits_the_idle_timeout(
    impatient: OpenAIAdapter, fake_openai: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(stall_after=3, stall_s=1.5))
    with pytest.raises(ProviderError) as info:
        async with impatient.stream("chat", CHAT, {}) as chunks:
            async for _ in chunks:
                pass
    assert info.value.kind == "timeout"


async def test_unknown_logical_model_is_unsupported(adapter: OpenAIAdapter) -> None:
    with pytest.raises(ProviderError) as info:
        await adapter.complete("chat", {**CHAT, "model": "other"}, {})
    assert info.value.kind == "unsupported"


async def test_a_count_sends_a_tool_conversation_as_responses_items_and_tools(
    adapter: OpenAIAdapter, fake_openai: FakeProvider
) -> None:
    # What the model reads of a tool conversation is what OpenAI's count API must be given: the
    # calls and their results as Responses items, the tools in the Responses shape.
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        ],
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    assert await adapter.count_tokens(body, {}) > 0
    sent = fake_openai.requests[-1]
    assert sent.path == "/v1/responses/input_tokens"
    assert sent.body["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
    ]
    assert sent.body["tools"] == [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    ]
    assert sent.body["tool_choice"] == {"type": "function", "name": "get_weather"}

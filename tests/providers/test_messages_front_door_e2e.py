"""End to end: the official `anthropic` SDK calls the gateway's `/v1/messages`, served by a real
regional node process running a tiny Llama checkpoint, streaming and not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.gateway.conftest import NodeProcess, RunningGateway
from tests.providers.conftest import provider_entry
from tests.providers.gateway_harness import US_KEY, running_gateway
from tests.support.fake_providers import FakeProvider

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway(tmp_path: Path, node: NodeProcess, fake_openai: FakeProvider) -> Iterator[RunningGateway]:
    # A provider is configured too: the node must still be preferred while it is healthy.
    entry = provider_entry(fake_openai, "openai-us", jurisdiction="us")
    nodes = [
        {
            "node_id": node.node_id,
            "url": node.url,
            "region": "us-east",
            "jurisdiction": "us",
            "models": ["tiny"],
        }
    ]
    env = {entry["api_key_env"]: fake_openai.api_key}
    with running_gateway(tmp_path, providers=[entry], nodes=nodes, env=env) as gw:
        yield gw


def sdk(gateway: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=US_KEY, base_url=gateway.url, max_retries=0, timeout=60)


REQUEST = {
    "model": "tiny",
    "max_tokens": 8,
    # This SDK has no `temperature` argument any more; the front door still honours the field.
    "extra_body": {"temperature": 0.0},
    "system": "You are a test.",
    "messages": [{"role": "user", "content": "Count: one two three"}],
}


def test_node_serves_messages_create(gateway: RunningGateway, fake_openai: FakeProvider) -> None:
    raw = sdk(gateway).messages.with_raw_response.create(**REQUEST)  # type: ignore[arg-type]
    message = raw.parse()
    assert raw.headers["x-meridian-node"] == "us-1"
    assert not raw.headers["x-meridian-route"].startswith("provider=")
    assert message.type == "message" and message.model == "tiny"
    assert message.content[0].type == "text"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 8
    assert message.usage.input_tokens > 0
    assert not fake_openai.requests


def test_node_serves_messages_stream_with_the_same_greedy_text(gateway: RunningGateway) -> None:
    client = sdk(gateway)
    expected = client.messages.create(**REQUEST)  # type: ignore[arg-type]
    with client.messages.stream(**REQUEST) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == expected.content[0].text
    assert final.stop_reason == expected.stop_reason
    assert final.usage.output_tokens == expected.usage.output_tokens


def test_message_start_counts_the_prompt_as_the_final_usage_does(gateway: RunningGateway) -> None:
    """Anthropic's message_start carries the prompt's input tokens, and clients (Claude Code's
    context display) read them there: the node says its count as the stream opens, so the first
    event tells the client what the last one does, not 0."""
    client = sdk(gateway)
    whole = client.messages.create(**REQUEST)  # type: ignore[arg-type]
    prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    for _ in range(2):  # the second time, much of the prompt is a prefix-cache hit
        with client.messages.stream(**REQUEST) as stream:  # type: ignore[arg-type]
            events = list(stream)
        start = next(e for e in events if e.type == "message_start").message.usage
        delta = next(e for e in events if e.type == "message_delta").usage
        assert start.input_tokens + (start.cache_read_input_tokens or 0) == prompt > 0
        assert (start.input_tokens, start.cache_read_input_tokens) == (
            delta.input_tokens,
            delta.cache_read_input_tokens,
        )
        assert start.output_tokens == 0


def test_a_stop_sequence_the_node_matched_is_named_streamed_or_not(gateway: RunningGateway) -> None:
    """The node reports the stop string it matched (vLLM's `stop_reason`), so the door answers
    `stop_sequence` with that string, as Anthropic does, rather than `end_turn`. Any piece of the
    greedy answer, as the stop sequence, ends the answer just before its first occurrence."""
    client = sdk(gateway)
    request = {**REQUEST, "max_tokens": 16}
    text = client.messages.create(**request).content[0].text  # type: ignore[arg-type]
    pieces = {text[i : i + k] for k in (1, 2, 4) for i in range(len(text) - k + 1)}
    pieces = sorted(p for p in pieces if p.strip())  # Anthropic refuses blank stop sequences
    assert pieces, text
    unmatched = "\x1fnever"
    for piece in pieces[:: max(1, len(pieces) // 6)]:
        stops = [unmatched, piece]
        message = client.messages.create(**request, stop_sequences=stops)  # type: ignore[arg-type]
        with client.messages.stream(**request, stop_sequences=stops) as stream:  # type: ignore[arg-type]
            streamed = stream.get_final_message()
        for answer in (message, streamed):
            assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", piece), text
            assert answer.content[0].text == text[: text.index(piece)]
    # A stop sequence that never comes leaves the answer as it was, ended by its length.
    message = client.messages.create(**request, stop_sequences=[unmatched])  # type: ignore[arg-type]
    assert (message.content[0].text, message.stop_sequence) == (text, None)
    assert message.stop_reason in ("end_turn", "max_tokens")


def test_a_last_assistant_message_is_continued_as_anthropic_prefills(gateway: RunningGateway) -> None:
    """Anthropic's prefill: the answer goes on from the last assistant message's text. The node
    serves it as the OpenAI door's `continue_final_message` does, not as a new assistant turn."""
    messages = [
        {"role": "user", "content": "Count: one two three"},
        {"role": "assistant", "content": "one two"},
    ]
    prefilled = sdk(gateway).messages.create(**{**REQUEST, "messages": messages})  # type: ignore[arg-type]

    def chat(**fields: object) -> str:
        body = {
            "model": "tiny",
            "max_tokens": 8,
            "temperature": 0.0,
            "messages": [{"role": "system", "content": REQUEST["system"]}, *messages],
            **fields,
        }
        answer = httpx.post(
            gateway.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {US_KEY}"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["message"]["content"]

    continued = chat(continue_final_message=True, add_generation_prompt=False)
    assert continued != chat()  # a new turn answers otherwise, so the two are told apart
    assert prefilled.content[0].text == continued

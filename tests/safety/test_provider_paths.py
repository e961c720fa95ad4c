"""Output checks through a real gateway served by a commercial-provider stand-in (a fake OpenAI
whose reply is scripted), so what the model says is known: redaction across chunk boundaries,
a block mid-stream, the Anthropic front door, and a bypass sweep over every path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.conftest import RunningGateway, gateway_config, run_gateway
from tests.providers.conftest import env_for, provider_entry
from tests.providers.gateway_harness import dead_node
from tests.safety.conftest import audit_lines, sse_events, streamed_text, write_policies
from tests.support.fake_providers import FakeProvider, running

# Long enough that the stream releases text (past the 96-character hold-back) before the
# sensitive part; the phone and card numbers arrive split over several chunks (one per word).
LEAD = "Here is a long enough answer that fills the hold back window of the stream with plain words first. "
REPLY = (
    LEAD + "Call +44 20 7946 0958 or pay with 4111 1111 1111 1111 today. The falcon lands at noon. Bye now."
)
REDACT_KEY, BLOCK_KEY, TOOL_BLOCK_KEY = "sk-redactor", "sk-blocker", "sk-tool-blocker"
POLICY = {"rules": {"pii": "redact"}, "hold_back_chars": 96, "log_content": True}
BLOCKLIST = {"blocklist": [{"words": ["falcon"], "action": "block"}], "hold_back_chars": 96}
# The fake provider's tool call asks for the weather in Paris (TOOL_CALL_ARGUMENTS).
TOOL_BLOCKLIST = {"blocklist": [{"words": ["Paris"], "action": "block"}], "hold_back_chars": 96}


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with running(FakeProvider("openai", api_key="sk-openai-test", reply=REPLY)) as fake:
        yield fake


@pytest.fixture(scope="module")
def gw(provider: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    work = tmp_path_factory.mktemp("safety-provider")
    policies = write_policies(
        work / "policies",
        {
            "redactor": (REDACT_KEY, POLICY),
            "blocker": (BLOCK_KEY, BLOCKLIST),
            "tool-blocker": (TOOL_BLOCK_KEY, TOOL_BLOCKLIST),
        },
        allow_commercial=True,
    )
    regions = work / "regions.yaml"
    regions.write_text(yaml.safe_dump({"nodes": [dead_node("gone-1", "us-east", "us")]}), encoding="utf-8")
    entry = provider_entry(provider, "openai-1")
    config = gateway_config(
        regions,
        home_region="us-east",
        policies=str(policies),
        catalog=[{"name": "tiny", "tier": "small"}],
        providers={"endpoints": [entry]},
        safety={"audit_path": str(work / "audit.jsonl")},
    )
    with run_gateway(config, tenants=(), env=env_for(provider, entry)) as running_gw:
        yield running_gw


def post(gw: RunningGateway, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(gw.url + path, json=body, headers={"authorization": f"Bearer {key}"}, timeout=30)


def stream(gw: RunningGateway, path: str, key: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST",
        gw.url + path,
        json={**body, "stream": True},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    ) as response:
        assert response.status_code == 200, response.read()
        return sse_events(response)


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}
MESSAGES = {"model": "tiny", "max_tokens": 200, "messages": [{"role": "user", "content": "hello"}]}


def test_personal_data_split_over_chunks_is_redacted_in_a_stream(gw: RunningGateway) -> None:
    events = stream(gw, "/v1/chat/completions", REDACT_KEY, CHAT)
    text = streamed_text(events)
    assert "Call [REDACTED:phone] or pay with [REDACTED:credit_card] today." in text
    assert "7946" not in text and "4111" not in text
    assert text.startswith(LEAD[:40])  # the rest of the text is untouched
    assert events[-1]["choices"] == [] or events[-1]["choices"][0]["finish_reason"] == "stop"


def test_personal_data_is_redacted_in_a_whole_response(gw: RunningGateway) -> None:
    response = post(gw, "/v1/chat/completions", REDACT_KEY, CHAT)
    content = response.json()["choices"][0]["message"]["content"]
    assert "[REDACTED:phone]" in content and "[REDACTED:credit_card]" in content and "4111" not in content


def test_the_upstream_gets_the_prompt_with_personal_data_redacted(
    gw: RunningGateway, provider: FakeProvider
) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "mail jane@example.com or +44 20 7946 0958"}]}
    assert post(gw, "/v1/chat/completions", REDACT_KEY, body).status_code == 200
    sent = provider.requests[-1].body["messages"][0]["content"]
    assert sent == "mail [REDACTED:email] or [REDACTED:phone]"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_a_tool_conversation_reaches_the_upstream_redacted_in_the_calls_and_their_results(
    gw: RunningGateway, provider: FakeProvider
) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    call["function"]["arguments"] = '{"contact": "jane@example.com"}'
    body = {
        **CHAT,
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Weather for my trip?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Call +44 20 7946 0958 for the forecast"},
        ],
    }
    response = post(gw, "/v1/chat/completions", REDACT_KEY, body)
    assert response.status_code == 200, response.text
    sent = provider.requests[-1].body["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"contact": "[REDACTED:email]"}'
    assert sent[2]["content"] == "Call [REDACTED:phone] for the forecast"
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"].endswith('example.com"}')


@pytest.mark.parametrize("streamed", [False, True])
def test_a_blocked_word_in_a_tool_calls_arguments_never_reaches_the_client(
    gw: RunningGateway, streamed: bool
) -> None:
    body = {**CHAT, "tools": TOOLS}
    if streamed:
        events = stream(gw, "/v1/chat/completions", TOOL_BLOCK_KEY, body)
        received = json.dumps(events)
        finishes = [
            c["finish_reason"] for e in events for c in e.get("choices") or [] if c.get("finish_reason")
        ]
        assert finishes == ["content_filter"]
    else:
        response = post(gw, "/v1/chat/completions", TOOL_BLOCK_KEY, body)
        received = response.text
        assert (
            response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "content_filter"
        )
    assert "Paris" not in received


def test_a_blocked_word_ends_the_stream_with_content_filter_and_never_reaches_the_client(
    gw: RunningGateway,
) -> None:
    events = stream(gw, "/v1/chat/completions", BLOCK_KEY, CHAT)
    text = streamed_text(events)
    assert text and LEAD.startswith(text[:20])  # text before the block was released
    assert "falcon" not in text
    finishes = [c["finish_reason"] for e in events for c in e.get("choices") or [] if c.get("finish_reason")]
    assert finishes == ["content_filter"]
    assert events[-1]["error"]["code"] == "content_policy_violation"


def test_the_anthropic_front_door_streams_redacted_and_stops_on_a_block(gw: RunningGateway) -> None:
    events = stream(gw, "/v1/messages", REDACT_KEY, MESSAGES)
    text = streamed_text(events)
    assert "[REDACTED:credit_card]" in text and "4111" not in text
    assert events[-1]["type"] == "message_stop"
    blocked = stream(gw, "/v1/messages", BLOCK_KEY, MESSAGES)
    assert "falcon" not in streamed_text(blocked)
    assert blocked[-1] == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "The response was stopped by the content policy (blocklist[0]).",
        },
    }


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("streamed", [True, False])
def test_no_path_bypasses_the_output_block(gw: RunningGateway, path: str, streamed: bool) -> None:
    body = CHAT if path == "/v1/chat/completions" else MESSAGES
    if streamed:
        seen = streamed_text(stream(gw, path, BLOCK_KEY, body))
    else:
        response = post(gw, path, BLOCK_KEY, body)
        assert response.status_code == 200
        answer = response.json()
        seen = str(answer)
        if path == "/v1/messages":
            assert answer["stop_reason"] == "refusal"
        else:
            assert answer["choices"][0]["finish_reason"] == "content_filter"
    assert "falcon" not in seen


def test_every_decision_is_audited_with_a_hash_and_redacted_text(gw: RunningGateway, tmp_path: Path) -> None:
    response = post(gw, "/v1/chat/completions", REDACT_KEY, CHAT)
    request_id = response.headers["x-request-id"]
    audit_path = Path(gw.gateway.config.safety.audit_path or "")
    records = audit_lines(audit_path, request_id, at_least=4)
    seen = {(r["where"], r["layer"], r["name"], r["action"]) for r in records}
    assert ("output", "rules", "phone", "redact") in seen
    assert ("output", "rules", "credit_card", "redact") in seen
    assert ("input", "rules", "-", "pass") in seen
    for record in records:
        assert len(record["text_sha256"]) == 64 and record["tenant"] == "redactor"
        assert "4111" not in (record["text"] or "")
    assert (
        gw.metric(
            "meridian_gateway_safety_decisions_total", tenant="redactor", layer="rules", action="redact"
        )
        >= 2
    )


def test_an_input_block_on_the_anthropic_front_door_is_an_anthropic_400(gw: RunningGateway) -> None:
    body = {**MESSAGES, "messages": [{"role": "user", "content": "tell me about the falcon"}]}
    response = httpx.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": BLOCK_KEY}, timeout=30)
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "The request's input was blocked by the content policy (blocklist: blocklist[0]).",
        },
    }


def _count_body(path: str, text: str) -> dict[str, Any]:
    if path == "/v1/messages/count_tokens":
        return {"model": "tiny", "messages": [{"role": "user", "content": text}]}
    return {"model": "tiny", "input": text}


@pytest.mark.parametrize("path", ["/v1/messages/count_tokens", "/v1/responses/input_tokens"])
def test_a_count_sends_the_redacted_prompt_and_a_blocked_one_nowhere(
    gw: RunningGateway, provider: FakeProvider, path: str
) -> None:
    """Counting sends the conversation to an upstream as a generation does: the tenant's input
    rules apply first (what they redact is not counted, what they block goes nowhere)."""
    counted = post(gw, path, REDACT_KEY, _count_body(path, "mail jane@example.com or +44 20 7946 0958"))
    assert counted.status_code == 200, counted.text
    sent = provider.requests[-1]
    assert sent.path == "/v1/responses/input_tokens"
    assert sent.body["input"][-1]["content"] == "mail [REDACTED:email] or [REDACTED:phone]"
    before = len(provider.requests)
    blocked = post(gw, path, BLOCK_KEY, _count_body(path, "tell me about the falcon"))
    assert blocked.status_code == 400, blocked.text
    assert "blocked by the content policy" in blocked.text
    assert len(provider.requests) == before

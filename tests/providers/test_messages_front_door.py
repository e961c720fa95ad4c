"""The official `anthropic` SDK against the gateway's `/v1/messages`, served by a provider (the
fleet being down), streaming and not; errors in Anthropic's shape. The same door served by a
real regional node is in test_messages_front_door_e2e."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.gateway.conftest import RunningGateway
from tests.providers.conftest import provider_entry
from tests.providers.gateway_harness import PRIVATE_KEY, US_KEY, dead_node, running_gateway
from tests.support.fake_providers import FakeProvider, Fault


@pytest.fixture
def gateway(tmp_path: Path, fake_openai: FakeProvider) -> Iterator[RunningGateway]:
    entry = provider_entry(fake_openai, "openai-us", jurisdiction="us")
    env = {entry["api_key_env"]: fake_openai.api_key}
    with running_gateway(
        tmp_path, providers=[entry], nodes=[dead_node("us-1", "us-east", "us")], env=env
    ) as gw:
        yield gw


def client(gateway: RunningGateway, key: str = US_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=gateway.url, max_retries=0, timeout=20)


def test_sdk_create_gets_a_message(gateway: RunningGateway, fake_openai: FakeProvider) -> None:
    message = client(gateway).messages.create(
        model="tiny",
        max_tokens=32,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hello"}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text == fake_openai.reply
    assert message.stop_reason == "end_turn"
    assert message.model == "tiny"
    assert message.usage.output_tokens == len(fake_openai.reply.split(" "))
    assert message.usage.input_tokens > 0
    sent = fake_openai.requests[-1].body
    assert sent["messages"][0] == {"role": "system", "content": "You are terse."}
    assert sent["max_tokens"] == 32


def test_sdk_max_tokens_stop_reason(gateway: RunningGateway) -> None:
    message = client(gateway).messages.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Say hello"}]
    )
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == "Hello from"


def test_sdk_stream_gets_the_event_sequence(gateway: RunningGateway, fake_openai: FakeProvider) -> None:
    with client(gateway).messages.stream(
        model="tiny", max_tokens=32, messages=[{"role": "user", "content": "Say hello"}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert final.content[0].text == fake_openai.reply
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(fake_openai.reply.split(" "))
    assert final.usage.input_tokens > 0


def test_raw_stream_has_event_lines(gateway: RunningGateway) -> None:
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/messages",
        json={
            "model": "tiny",
            "max_tokens": 8,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
        },
        headers={"authorization": f"Bearer {US_KEY}"},  # the other way to send the key
        timeout=20,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "[DONE]" not in text


def test_wrong_key_is_an_anthropic_authentication_error(gateway: RunningGateway) -> None:
    with pytest.raises(anthropic.AuthenticationError) as info:
        client(gateway, "sk-wrong").messages.create(
            model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    assert info.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": info.value.body["error"]["message"]},
    }


def test_invalid_request_names_the_field(gateway: RunningGateway) -> None:
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]},  # no max_tokens
        headers={"x-api-key": US_KEY},
        timeout=20,
    )
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in error["error"]["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 1.5), ("temperature", -0.1), ("top_p", 1.2), ("top_k", -1)],
)
def test_sampling_settings_outside_anthropics_ranges_are_refused(
    gateway: RunningGateway, fake_openai: FakeProvider, field: str, value: float
) -> None:
    """Anthropic's API takes temperature and top_p in [0, 1]: a client written against it gets its
    400 here too, not an answer sampled hotter than it could have asked for."""
    sent = len(fake_openai.requests)
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], field: value}
    response = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": US_KEY}, timeout=20)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"]
    assert len(fake_openai.requests) == sent
    edge = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}[field]
    assert (
        httpx.post(
            f"{gateway.url}/v1/messages",
            json={**body, field: edge},
            headers={"x-api-key": US_KEY},
            timeout=20,
        ).status_code
        == 200
    )


def test_image_blocks_are_refused_as_invalid(gateway: RunningGateway) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as info:
        client(gateway).messages.create(
            model="tiny", max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )
    assert info.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "tool", "name": "lookup"}}, "tool_choice"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ],
)
def test_what_would_change_the_answer_is_refused_by_name_not_dropped(
    gateway: RunningGateway, fake_openai: FakeProvider, fields: dict, param: str
) -> None:
    """Answering without the server tool (or the thinking) asked for would be a different answer;
    a tool choice without tools asks for nothing an answer could be. Client tools are served:
    test_messages_tools_e2e."""
    sent = len(fake_openai.requests)
    response = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], **fields},
        headers={"x-api-key": US_KEY},
        timeout=20,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and f"`{param}`" in error["message"]
    assert len(fake_openai.requests) == sent  # nothing went upstream


def test_unknown_model_is_not_found(gateway: RunningGateway) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        client(gateway).messages.create(
            model="nope", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    assert info.value.body["error"]["type"] == "not_found_error"


def test_no_target_is_overloaded(gateway: RunningGateway) -> None:
    with pytest.raises(anthropic.InternalServerError) as info:
        client(gateway, PRIVATE_KEY).messages.create(
            model="tiny", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    assert info.value.status_code == 503
    assert info.value.body["error"]["type"] == "overloaded_error"


def test_stream_broken_midway_ends_with_an_error_event(
    gateway: RunningGateway, fake_openai: FakeProvider
) -> None:
    fake_openai.fail_next(Fault(cut_after=4))
    with pytest.raises(anthropic.APIStatusError) as info:  # the SDK raises on an `error` event
        with client(gateway).messages.stream(
            model="tiny", max_tokens=32, messages=[{"role": "user", "content": "Say hello"}]
        ) as stream:
            for _ in stream:
                pass
    assert info.value.body["error"]["type"] == "api_error"

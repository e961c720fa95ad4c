"""With MERIDIAN_NODE_TOKEN set, every call but /health needs `Authorization: Bearer <token>`."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.node.conftest import CHAT_MODEL, Node

PROTECTED = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models"),
    ("GET", "/ready"),
    ("GET", "/load"),
    ("GET", "/metrics"),
]


@pytest.mark.parametrize(("method", "path"), PROTECTED)
@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong-token"}, {"authorization": "Basic bm9kZQ=="}],
    ids=["missing", "wrong", "not_bearer"],
)
def test_calls_without_the_token_are_401(node: Node, method: str, path: str, headers: dict[str, str]) -> None:
    body = {"model": CHAT_MODEL, "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    response = httpx.request(
        method, f"{node.url}{path}", headers=headers, json=body if method == "POST" else None
    )
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] in ("invalid_api_key", "missing_api_key")


def test_health_needs_no_token(node: Node) -> None:
    response = httpx.get(f"{node.url}/health")
    assert response.status_code == 200


def test_sdk_with_a_wrong_key_gets_authentication_error(node: Node) -> None:
    with openai.OpenAI(base_url=f"{node.url}/v1", api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "x"}])

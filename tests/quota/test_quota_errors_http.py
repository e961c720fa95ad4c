"""Quota refusals as clients see them: the gate's domain errors through the gateway's front doors.

The gate raises QuotaExceeded / QuotaUnavailable / RequestTooLarge; gateway/errors.py is the
one place they become OpenAI (or, on /v1/messages, Anthropic) error answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config import load_config
from tests.quota.gateway_setup import MODEL, api_key, write_gateway_config
from tests.support.processes import free_port

Client = Callable[..., AbstractAsyncContextManager[AsyncTestClient]]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture
def gateway(tmp_path: Path) -> Client:
    @asynccontextmanager
    async def start(
        limits: dict[str, int], *, fail_mode: str = "open", quota: dict[str, Any] | None = None
    ) -> AsyncIterator[AsyncTestClient]:
        tenants = [{"id": "alpha", "limits": limits, "fail_mode": fail_mode}]
        dead_node = f"http://127.0.0.1:{free_port()}"  # admission comes before any node is asked
        path = write_gateway_config(tmp_path, node_url=dead_node, tenants=tenants, quota=quota)
        async with AsyncTestClient(create_app(load_config(path), env={})) as client:
            yield client

    return start


AUTH = {"authorization": f"Bearer {api_key('alpha')}"}


async def test_over_the_limit_is_a_429_with_retry_after_and_rate_limit_headers(gateway: Client) -> None:
    async with gateway({"requests_per_minute": 1}) as client:
        await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)  # admitted; no node serves it
        response = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert response.status_code == 429
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("rate_limit_error", "rate_limit_exceeded", None)
    assert "requests per minute (RPM): Limit 1, Used 1" in error["message"]
    assert int(response.headers["retry-after"]) >= 1 and int(response.headers["retry-after-ms"]) > 0
    assert response.headers["x-ratelimit-limit-requests"] == "1"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.headers["x-request-id"].startswith("req_")


async def test_an_estimate_above_a_token_limit_is_a_400_naming_max_tokens(gateway: Client) -> None:
    async with gateway({"tokens_per_minute": 50}) as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1000}, headers=AUTH)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "request_too_large",
        "max_tokens",
    )
    assert "can never be admitted" in error["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/quota"])
async def test_fail_closed_tenant_gets_503_while_the_quota_store_is_down(gateway: Client, path: str) -> None:
    quota = {"redis_url": f"redis://127.0.0.1:{free_port()}/0", "timeout_ms": 100}  # nothing listens
    async with gateway({"requests_per_minute": 10}, fail_mode="closed", quota=quota) as client:
        if path == "/v1/quota":
            response = await client.get(path, headers=AUTH)
        else:
            response = await client.post(path, json=CHAT, headers=AUTH)
    assert response.status_code == 503
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "quota_store_unavailable")
    assert "fail-closed" in error["message"]
    assert int(response.headers["retry-after"]) >= 1


async def test_the_messages_front_door_answers_a_refusal_in_anthropics_format(gateway: Client) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": api_key("alpha"), "anthropic-version": "2023-06-01"}
    async with gateway({"requests_per_minute": 1}) as client:
        await client.post("/v1/messages", json=body, headers=headers)
        response = await client.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 429
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert int(response.headers["retry-after"]) >= 1


async def test_admissions_are_counted_by_the_store_that_made_them_local_when_redis_is_down(
    gateway: Client,
) -> None:
    """What the MeridianQuotaOnLocalFallback alert watches (deploy/k8s/base/monitoring)."""
    quota = {"redis_url": f"redis://127.0.0.1:{free_port()}/0", "timeout_ms": 100}  # nothing listens
    async with gateway({"requests_per_minute": 10}, quota=quota) as client:
        response = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert response.headers["x-meridian-quota"] == "local"  # admitted, then no node served it
        metrics = client.app.state["gateway"].metrics.render().decode()  # the admin listener's /metrics
    assert 'meridian_gateway_quota_admissions_total{store="local",tenant="alpha"} 1.0' in metrics
    async with gateway({"requests_per_minute": 10}) as client:  # the in-process store
        await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        metrics = client.app.state["gateway"].metrics.render().decode()  # the admin listener's /metrics
    assert 'meridian_gateway_quota_admissions_total{store="memory",tenant="alpha"} 1.0' in metrics

"""GET /v1/usage through the gateway app: the caller's own tenant only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config import load_config
from tests.quota.gateway_setup import api_key, write_gateway_config
from tests.support.processes import free_port


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AsyncTestClient]:
    tenants = [
        {"id": "alpha", "limits": {"requests_per_minute": 10, "tokens_per_minute": 5000}},
        {"id": "beta", "limits": {"requests_per_minute": 10}},
    ]
    dead_node = f"http://127.0.0.1:{free_port()}"  # the usage route needs no node
    config = load_config(write_gateway_config(tmp_path, node_url=dead_node, tenants=tenants, quota=None))
    async with AsyncTestClient(create_app(config, env={})) as test_client:
        yield test_client


async def test_usage_shows_the_callers_windows(client: AsyncTestClient) -> None:
    response = await client.get("/v1/quota", headers={"authorization": f"Bearer {api_key('alpha')}"})
    assert response.status_code == 200
    body = response.json()
    assert body["tenant"] == "alpha" and body["source"] == "memory"
    assert body["requests"] == {"limit": 10, "used": 0, "remaining": 10, "reset": "0ms"}
    assert body["tokens"]["remaining"] == 5000


async def test_usage_of_own_tenant_by_name_is_allowed(client: AsyncTestClient) -> None:
    response = await client.get(
        "/v1/quota?tenant=alpha", headers={"authorization": f"Bearer {api_key('alpha')}"}
    )
    assert response.status_code == 200 and response.json()["tenant"] == "alpha"


async def test_usage_of_another_tenant_is_forbidden(client: AsyncTestClient) -> None:
    response = await client.get(
        "/v1/quota?tenant=beta", headers={"authorization": f"Bearer {api_key('alpha')}"}
    )
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error"
    assert response.json()["error"]["param"] == "tenant"


async def test_usage_needs_an_api_key(client: AsyncTestClient) -> None:
    response = await client.get("/v1/quota?tenant=alpha")
    assert response.status_code == 401

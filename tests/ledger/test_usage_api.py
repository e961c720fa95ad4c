"""GET /v1/usage and /v1/costs over a populated ledger: buckets, grouping, pagination, scoping and
every bad parameter (through the real app, with a SQLite ledger)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config import load_config
from gateway.policy.keys import hash_api_key
from tests.ledger.conftest import DAY_MS, T0_MS, event
from tests.quota.gateway_setup import api_key, write_gateway_config
from tests.support.processes import free_port

OPERATOR_KEY = "sk-operator-ledger"
T0 = T0_MS // 1000
HOUR = 3600


def auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key(tenant)}"}


OPERATOR = {"authorization": f"Bearer {OPERATOR_KEY}"}

EVENTS = [
    event("a1", tenant_id="alpha", ts_ms=T0_MS + 10_000, model="m1", region="eu-west", cost_usd=0.5),
    event("a2", tenant_id="alpha", ts_ms=T0_MS + 70_000, model="m2", region="us-east", cost_usd=0.25,
          cached_tokens=4),
    event("a3", tenant_id="alpha", ts_ms=T0_MS + 2 * HOUR * 1000, model="m1", region="eu-west", cost_usd=1.0,
          api_key_id="key_bbbbbbbbbbbb"),
    event("a4", tenant_id="alpha", ts_ms=T0_MS + 3 * DAY_MS, model="m1", cost_usd=2.0),
    event("b1", tenant_id="beta", ts_ms=T0_MS + 20_000, model="m1", cost_usd=8.0, prompt_tokens=100),
]  # fmt: skip


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[AsyncTestClient]:
    tenants = [{"id": "alpha", "limits": {}}, {"id": "beta", "limits": {}}]
    dead_node = f"http://127.0.0.1:{free_port()}"
    path = write_gateway_config(tmp_path, node_url=dead_node, tenants=tenants, quota=None)
    data = yaml.safe_load(path.read_text())
    data["ledger"] = {"store": {"path": "ledger.sqlite"}, "operator_keys": [hash_api_key(OPERATOR_KEY)]}
    path.write_text(yaml.safe_dump(data))
    app = create_app(load_config(path), env={})
    async with AsyncTestClient(app) as test_client:
        ledger = app.state["gateway"].ledger
        await ledger.store.commit(EVENTS)
        yield test_client


async def get(client: AsyncTestClient, path: str, headers: dict[str, str], **params: Any) -> Any:
    response = await client.get(path, params=params, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def test_daily_buckets_hold_the_tenants_own_usage(client: AsyncTestClient) -> None:
    body = await get(client, "/v1/usage", auth("alpha"), start_time=T0, end_time=T0 + 4 * 86400)
    assert body["object"] == "page" and body["has_more"] is False and body["next_page"] is None
    assert [b["start_time"] - T0 for b in body["data"]] == [0, 86400, 2 * 86400, 3 * 86400]
    first = body["data"][0]
    assert first["end_time"] == T0 + 86400
    [result] = first["results"]
    assert result["object"] == "organization.usage.completions.result"
    assert (result["num_model_requests"], result["input_tokens"], result["input_cached_tokens"]) == (3, 30, 4)
    assert result["output_tokens"] == 15 and result["model"] is None
    assert body["data"][1]["results"] == [] and body["data"][2]["results"] == []
    assert body["data"][3]["results"][0]["num_model_requests"] == 1


async def test_minute_buckets_split_at_minute_edges(client: AsyncTestClient) -> None:
    body = await get(client, "/v1/usage", auth("alpha"), start_time=T0, end_time=T0 + 180, bucket_width="1m")
    counts = [sum(r["num_model_requests"] for r in b["results"]) for b in body["data"]]
    assert counts == [1, 1, 0]


async def test_start_time_inside_a_bucket_reports_that_whole_bucket(client: AsyncTestClient) -> None:
    body = await get(
        client, "/v1/usage", auth("alpha"), start_time=T0 + 30, end_time=T0 + 90, bucket_width="1m"
    )
    assert [b["start_time"] for b in body["data"]] == [T0, T0 + 60]


async def test_group_by_model_and_region(client: AsyncTestClient) -> None:
    body = await get(
        client, "/v1/usage", auth("alpha"), start_time=T0, end_time=T0 + 86400, group_by="model,region"
    )
    results = {(r["model"], r["region"]): r["num_model_requests"] for r in body["data"][0]["results"]}
    assert results == {("m1", "eu-west"): 2, ("m2", "us-east"): 1}


async def test_group_by_in_openai_sdk_array_form(client: AsyncTestClient) -> None:
    response = await client.get(
        f"/v1/usage?start_time={T0}&end_time={T0 + 86400}&group_by[]=model&group_by[]=api_key_id",
        headers=auth("alpha"),
    )
    results = response.json()["data"][0]["results"]
    assert {(r["model"], r["api_key_id"]) for r in results} == {
        ("m1", "key_aaaaaaaaaaaa"),
        ("m2", "key_aaaaaaaaaaaa"),
        ("m1", "key_bbbbbbbbbbbb"),
    }


async def test_pages_cover_every_bucket_once(client: AsyncTestClient) -> None:
    seen, params = [], {"start_time": T0, "end_time": T0 + 5 * 86400, "limit": 2}
    for _ in range(10):
        body = await get(client, "/v1/usage", auth("alpha"), **params)
        seen += [b["start_time"] for b in body["data"]]
        if not body["has_more"]:
            assert body["next_page"] is None
            break
        params["page"] = body["next_page"]
    assert seen == [T0 + i * 86400 for i in range(5)]


async def test_costs_by_day_and_by_model(client: AsyncTestClient) -> None:
    body = await get(client, "/v1/costs", auth("alpha"), start_time=T0, end_time=T0 + 86400)
    [result] = body["data"][0]["results"]
    assert result["object"] == "organization.costs.result"
    assert result["amount"] == {"value": pytest.approx(1.75), "currency": "usd"}
    body = await get(
        client, "/v1/costs", auth("alpha"), start_time=T0, end_time=T0 + 86400, group_by="line_item"
    )
    assert {r["line_item"]: r["amount"]["value"] for r in body["data"][0]["results"]} == {
        "m1": pytest.approx(1.5),
        "m2": pytest.approx(0.25),
    }


async def test_the_simple_daily_form(client: AsyncTestClient) -> None:
    body = await get(client, "/v1/usage", auth("alpha"), date="2026-11-01")
    assert body["tenant_id"] == "alpha" and body["date"] == "2026-11-01"
    assert (body["input_tokens"], body["output_tokens"], body["num_model_requests"]) == (30, 15, 3)
    assert body["cost_usd"] == pytest.approx(1.75)
    empty = await get(client, "/v1/usage", auth("alpha"), date="2026-11-02")
    assert (empty["input_tokens"], empty["cost_usd"]) == (0, 0)


async def test_a_tenant_never_sees_another_tenants_usage(client: AsyncTestClient) -> None:
    body = await get(client, "/v1/usage", auth("beta"), start_time=T0, end_time=T0 + 86400)
    assert body["data"][0]["results"][0]["input_tokens"] == 100
    response = await client.get(
        "/v1/usage", params={"date": "2026-11-01", "tenant": "alpha"}, headers=auth("beta")
    )
    assert response.status_code == 403
    assert response.json()["error"]["param"] == "tenant"
    response = await client.get(
        "/v1/costs", params={"start_time": T0, "tenant": "alpha"}, headers=auth("beta")
    )
    assert response.status_code == 403


async def test_usage_needs_a_key(client: AsyncTestClient) -> None:
    assert (await client.get("/v1/usage", params={"date": "2026-11-01"})).status_code == 401
    bad = {"authorization": "Bearer sk-nobody"}
    assert (await client.get("/v1/costs", params={"start_time": T0}, headers=bad)).status_code == 401


@pytest.mark.parametrize(
    "params", [{}, {"start_time": "yesterday"}, {"date": "2026-13-01"}, {"colour": "red"}]
)
@pytest.mark.parametrize("path", ["/v1/usage", "/v1/costs"])
async def test_without_a_valid_key_the_answer_is_a_401_whatever_the_query(
    client: AsyncTestClient, path: str, params: dict[str, str]
) -> None:
    """The key is checked before the query: a caller without one learns nothing of the API, and
    tools that drop the Authorization header (schemathesis does) see the 401 they expect."""
    for headers in ({}, {"authorization": "Bearer sk-nobody"}):
        response = await client.get(path, params=params, headers=headers)
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", ["/v1/usage", "/v1/costs"])
async def test_without_start_time_the_answer_is_the_page_before_end_time(
    client: AsyncTestClient, path: str
) -> None:
    """OpenAI requires start_time; here it defaults to `limit` buckets before end_time (now by
    default), so every query the OpenAPI document allows is answered."""
    end = T0 + 4 * 86400
    body = await get(client, path, auth("alpha"), end_time=end)
    assert [b["start_time"] for b in body["data"]] == [end - (7 - i) * 86400 for i in range(7)]
    explicit = await get(client, path, auth("alpha"), start_time=end - 7 * 86400, end_time=end)
    assert body == explicit
    hours = await get(client, path, auth("alpha"), end_time=T0 + 3 * HOUR, bucket_width="1h", limit=3)
    assert [b["start_time"] - T0 for b in hours["data"]] == [0, HOUR, 2 * HOUR]
    assert (await client.get(path, headers=auth("alpha"))).status_code == 200


@pytest.mark.parametrize("path", ["/v1/usage", "/v1/costs"])
async def test_without_start_time_the_page_ends_with_the_bucket_that_holds_end_time(
    client: AsyncTestClient, path: str
) -> None:
    """`now` is inside today's bucket: the default page is the last 7 days with today, not the 7
    before it (today's usage, what a caller looks for first, was on a second page)."""
    end = T0 + 3 * 86400 + 5 * HOUR  # a4 is at T0 + 3 days
    body = await get(client, path, auth("alpha"), end_time=end)
    starts = [b["start_time"] for b in body["data"]]
    assert starts == [T0 + 3 * 86400 - (6 - i) * 86400 for i in range(7)] and body["has_more"] is False
    assert body["data"][-1]["results"], "the bucket holding end_time, with a4's usage"
    hours = await get(client, path, auth("alpha"), end_time=T0 + 2 * HOUR + 60, bucket_width="1h", limit=3)
    assert [b["start_time"] - T0 for b in hours["data"]] == [0, HOUR, 2 * HOUR]


async def test_the_operator_sees_all_tenants_or_the_one_it_names(client: AsyncTestClient) -> None:
    window = {"start_time": T0, "end_time": T0 + 86400}
    body = await get(client, "/v1/usage", OPERATOR, **window, group_by="tenant_id")
    assert {r["tenant_id"]: r["num_model_requests"] for r in body["data"][0]["results"]} == {
        "alpha": 3,
        "beta": 1,
    }
    body = await get(client, "/v1/costs", OPERATOR, **window, tenant="beta")
    assert body["data"][0]["results"][0]["amount"]["value"] == pytest.approx(8.0)
    day = await get(client, "/v1/usage", OPERATOR, date="2026-11-01")
    assert day["tenant_id"] is None and day["num_model_requests"] == 4


@pytest.fixture
async def postgres_client(tmp_path: Path, postgres_dsn: str) -> AsyncIterator[AsyncTestClient]:
    """The same gateway over a PostgreSQL ledger."""
    dead_node = f"http://127.0.0.1:{free_port()}"
    path = write_gateway_config(
        tmp_path, node_url=dead_node, tenants=[{"id": "alpha", "limits": {}}], quota=None
    )
    data = yaml.safe_load(path.read_text())
    data["ledger"] = {
        "store": {"type": "postgres", "dsn_env": "USAGE_TEST_DSN"},
        "operator_keys": [hash_api_key(OPERATOR_KEY)],
    }
    path.write_text(yaml.safe_dump(data))
    async with AsyncTestClient(
        create_app(load_config(path), env={"USAGE_TEST_DSN": postgres_dsn})
    ) as test_client:
        yield test_client


@pytest.mark.parametrize("params", [{"date": "2026-11-01"}, {"start_time": T0}])
async def test_a_tenant_named_with_nul_has_no_usage_even_on_postgres(
    postgres_client: AsyncTestClient, params: dict[str, Any]
) -> None:
    """An operator may name any tenant (the document allows any string). PostgreSQL's text cannot
    hold NUL, so asking it for such a tenant was a 503: no tenant holds one, so it has no usage."""
    client = postgres_client
    response = await client.get("/v1/usage", params={**params, "tenant": "al\x00pha"}, headers=OPERATOR)
    assert response.status_code == 200, response.text
    body = response.json()
    rows = [body] if "date" in params else [r for bucket in body["data"] for r in bucket["results"]]
    assert all(row.get("num_model_requests", 0) == 0 for row in rows), body
    # A tenant's key naming it names another tenant: a 403, as for any other.
    mine = await client.get("/v1/usage", params={**params, "tenant": "al\x00pha"}, headers=auth("alpha"))
    assert mine.status_code == 403, mine.text


async def test_the_quota_view_moved_to_v1_quota(client: AsyncTestClient) -> None:
    body = await get(client, "/v1/quota", auth("alpha"))
    assert body["object"] == "quota.usage" and body["tenant"] == "alpha"


@pytest.mark.parametrize(
    ("path", "params", "param"),
    [
        ("/v1/usage", {"start_time": "yesterday"}, "start_time"),
        ("/v1/usage", {"start_time": "-5"}, "start_time"),
        ("/v1/usage", {"start_time": T0, "end_time": T0}, "end_time"),
        ("/v1/usage", {"start_time": T0, "end_time": T0 - 60}, "end_time"),
        ("/v1/usage", {"start_time": T0, "end_time": "soon"}, "end_time"),
        ("/v1/usage", {"start_time": T0, "bucket_width": "1w"}, "bucket_width"),
        ("/v1/usage", {"start_time": T0, "group_by": "colour"}, "group_by"),
        ("/v1/usage", {"start_time": T0, "group_by": "model,line_item"}, "group_by"),
        ("/v1/costs", {"start_time": T0, "group_by": "batch"}, "group_by"),
        ("/v1/usage", {"start_time": T0, "limit": "0"}, "limit"),
        ("/v1/usage", {"start_time": T0, "limit": "32"}, "limit"),
        ("/v1/usage", {"start_time": T0, "bucket_width": "1h", "limit": "169"}, "limit"),
        ("/v1/usage", {"start_time": T0, "bucket_width": "1m", "limit": "1441"}, "limit"),
        ("/v1/usage", {"start_time": T0, "limit": "many"}, "limit"),
        ("/v1/usage", {"start_time": 0, "end_time": T0, "bucket_width": "1m"}, "end_time"),
        ("/v1/usage", {"start_time": T0, "end_time": T0 + 86400, "page": "page_x"}, "page"),
        ("/v1/usage", {"start_time": T0, "end_time": T0 + 86400, "page": "page_²"}, "page"),
        ("/v1/costs", {"start_time": T0, "end_time": T0 + 86400, "page": "page_" + "9" * 5000}, "page"),
        ("/v1/usage", {"start_time": "9" * 5000}, "start_time"),
        # Past the year 9999 the stores' 64-bit milliseconds overflow (10**20 was a 500).
        ("/v1/usage", {"end_time": 10**20}, "end_time"),
        ("/v1/costs", {"end_time": 253_402_300_800}, "end_time"),
        # int() takes these; a query's numbers are ASCII digits only.
        ("/v1/usage", {"start_time": "1_700_000_000"}, "start_time"),
        ("/v1/usage", {"start_time": "+1700000000"}, "start_time"),
        ("/v1/usage", {"start_time": T0, "limit": "٣"}, "limit"),
        ("/v1/usage", {"start_time": T0, "end_time": T0 + 86400, "page": f"page_{T0 + 7 * 86400}"}, "page"),
        ("/v1/usage", {"start_time": T0, "end_time": T0 + 86400, "page": f"page_{T0 + 60}"}, "page"),
        ("/v1/usage", {"start_time": T0, "colour": "red"}, "colour"),
        ("/v1/costs", {"start_time": T0, "date": "2026-11-01"}, "date"),
        ("/v1/usage", {"date": "2026-13-01"}, "date"),
        ("/v1/usage", {"date": "01/11/2026"}, "date"),
        ("/v1/usage", {"date": "2026-11-1"}, "date"),
        ("/v1/usage", {"date": "2026-11-01", "start_time": T0}, "date"),
    ],
)
async def test_every_bad_parameter_is_a_400_naming_it(
    client: AsyncTestClient, path: str, params: dict[str, Any], param: str
) -> None:
    response = await client.get(path, params=params, headers=auth("alpha"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert param in error["message"]


async def test_a_repeated_single_parameter_is_a_400(client: AsyncTestClient) -> None:
    response = await client.get(f"/v1/usage?start_time={T0}&start_time={T0 + 1}", headers=auth("alpha"))
    assert response.status_code == 400 and response.json()["error"]["param"] == "start_time"

"""The gateway's OpenAI API end to end: real node processes, the official `openai` SDK."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.gateway.conftest import (
    EU_KEY,
    GLOBAL_KEY,
    SMALL_KEY,
    TEST_TENANTS,
    NodeProcess,
    RunningGateway,
    gateway_over,
    running_fleet,
)

ROUTE_HEADERS = ("x-request-id", "x-meridian-region", "x-meridian-model", "x-meridian-route")


@pytest.fixture(scope="module")
def nodes(
    llama_checkpoint: Path, qwen2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    models = {"meridian-small": (llama_checkpoint, "small"), "meridian-large": (qwen2_checkpoint, "large")}
    placements = [
        ("us-east-1", "us-east", "us"),
        ("eu-west-1", "eu-west", "eu"),
    ]
    with running_fleet(placements, models, tmp_path_factory.mktemp("node-logs")) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def gw(nodes: list[NodeProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway_over(nodes, tmp_path_factory.mktemp("gw")) as running:
        yield running


def sdk(gw: RunningGateway, key: str = GLOBAL_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_chat_completion_returns_usage_and_route_headers(gw: RunningGateway) -> None:
    raw = sdk(gw).chat.completions.with_raw_response.create(
        model="meridian-small",
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=8,
        temperature=0,
    )
    completion = raw.parse()
    assert completion.model == "meridian-small"
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 8
    for header in ROUTE_HEADERS:
        assert raw.headers.get(header), header
    assert raw.headers["x-meridian-model"] == "meridian-small"
    # home_region is eu-west, so an unconstrained tenant is served there first.
    assert raw.headers["x-meridian-region"] == "eu-west"
    assert "token_ids" not in (completion.choices[0].model_extra or {})


def test_streaming_chat_relays_chunks_and_final_usage(gw: RunningGateway) -> None:
    with sdk(gw).chat.completions.with_streaming_response.create(
        model="meridian-large",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["x-meridian-model"] == "meridian-large"
        assert response.headers["x-meridian-region"] in ("eu-west", "us-east")
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all("token_ids" not in (choice.model_extra or {}) for c in chunks for choice in c.choices)


def test_a_streams_head_leaves_with_its_first_data_event(gw: RunningGateway) -> None:
    """The gateway answers a stream once its first chunk is in: the head and that chunk are one
    write (http_server/cork.py, gateway/api/sse.py), so a client's first read has both. Before,
    the first data event left a loop turn after the head, in a write of its own."""
    host, port = gw.url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "model": "meridian-small",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {GLOBAL_KEY}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=30) as client:
            client.sendall(head + body)
            first = client.recv(1 << 20)  # whatever the first write brought
            assert first.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in first
            assert b"data: {" in first.partition(b"\r\n\r\n")[2], first
            while not first.endswith(b"0\r\n\r\n"):  # read it to the end
                more = client.recv(1 << 20)
                assert more
                first += more


def test_legacy_completions_stream_and_not(gw: RunningGateway) -> None:
    client = sdk(gw)
    whole = client.completions.create(model="meridian-small", prompt="Once upon", max_tokens=6, temperature=0)
    streamed = client.completions.create(
        model="meridian-small", prompt="Once upon", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens == 6


def test_token_ids_are_passed_through_when_the_client_asks(gw: RunningGateway) -> None:
    stream = sdk(gw).chat.completions.create(
        model="meridian-small",
        messages=[{"role": "user", "content": "ids please"}],
        max_tokens=5,
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    ids = [
        t for c in stream for choice in c.choices for t in (choice.model_extra or {}).get("token_ids") or []
    ]
    assert len(ids) == 5


def test_a_nodes_alternatives_reach_the_client_streamed_and_not(gw: RunningGateway) -> None:
    """`top_logprobs` asks the node for each token's most likely alternatives: the client gets
    as many as it asked, most likely first, the same streamed and not."""
    args = {
        "model": "meridian-small",
        "messages": [{"role": "user", "content": "alternatives please"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": {"ignore_eos": True},
    }
    whole = sdk(gw).chat.completions.create(**args).choices[0].logprobs.content
    streamed = [
        entry
        for chunk in sdk(gw).chat.completions.create(stream=True, **args)
        for choice in chunk.choices
        if choice.logprobs is not None
        for entry in choice.logprobs.content or []
    ]
    assert len(whole) == len(streamed) == 5
    for entry, again in zip(whole, streamed, strict=True):
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        values = [a.logprob for a in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert [a.token for a in again.top_logprobs] == [a.token for a in entry.top_logprobs]


def test_auto_model_is_resolved_to_a_catalog_model(gw: RunningGateway) -> None:
    raw = sdk(gw).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    # The classifier starts a short chat on the small tier; the confidence cascade may then hand it
    # to the large one (these random models sample with little confidence): either way the answer
    # names the catalog model that served it.
    route = raw.headers["x-meridian-route"]
    assert route.startswith("auto:small")
    served = "meridian-large" if route.startswith("auto:small->large") else "meridian-small"
    assert raw.headers["x-meridian-model"] == served
    assert raw.parse().model == served


def test_models_list_only_what_the_tenant_may_use(gw: RunningGateway) -> None:
    assert {m.id for m in sdk(gw).models.list()} == {"meridian-small", "meridian-large"}
    assert [m.id for m in sdk(gw, SMALL_KEY).models.list()] == ["meridian-small"]


def test_a_model_is_retrieved_by_name_and_one_the_tenant_may_not_use_is_not_found(gw: RunningGateway) -> None:
    card = sdk(gw).models.retrieve("meridian-large")
    assert (card.id, card.object, card.owned_by) == ("meridian-large", "model", "meridian")
    assert card.created == next(m for m in sdk(gw).models.list() if m.id == "meridian-large").created
    # Listed for one key, not found for a key whose tenant may not use it, nor for unknown names
    # (a slash in a name is part of it, as in "org/model").
    for key, name in (
        (SMALL_KEY, "meridian-large"),
        (GLOBAL_KEY, "nope"),
        (GLOBAL_KEY, "org/meridian-small"),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            sdk(gw, key).models.retrieve(name)
        assert (info.value.code, info.value.param) == ("model_not_found", "model")
    unauthenticated = httpx.get(gw.url + "/v1/models/meridian-small", timeout=10)
    assert unauthenticated.status_code == 401


def claude(gw: RunningGateway, key: str = GLOBAL_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=30)


def test_the_anthropic_sdk_lists_and_retrieves_models_in_its_own_shapes(gw: RunningGateway) -> None:
    """Anthropic's SDK sends `anthropic-version` and its key as `x-api-key`: it gets Anthropic's
    model objects, paging and errors; the OpenAI SDK's answers are unchanged (tests above)."""
    in_order = [m.id for m in sdk(gw).models.list()]
    listed = list(claude(gw).models.list())
    assert [m.id for m in listed] == in_order
    for model in listed:
        assert (model.type, model.display_name) == ("model", model.id) and model.created_at.year >= 2026
    first = claude(gw).models.list(limit=1)
    assert len(first.data) == 1 and first.has_more and first.last_id == in_order[0]
    assert [m.id for m in claude(gw).models.list(limit=1)] == in_order  # the SDK pages by after_id
    back = claude(gw).models.list(limit=1, before_id=in_order[1])
    assert [m.id for m in back.data] == [in_order[0]] and not back.has_more
    assert [m.id for m in claude(gw, SMALL_KEY).models.list()] == ["meridian-small"]
    assert claude(gw).models.retrieve("meridian-large").id == "meridian-large"
    with pytest.raises(anthropic.NotFoundError) as hidden:
        claude(gw, SMALL_KEY).models.retrieve("meridian-large")
    assert hidden.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        claude(gw, "sk-wrong").models.list()
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude(gw).models.list(limit=0)
    assert bad.value.body["type"] == "error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"x-api-key": GLOBAL_KEY}, 200),
        ({"authorization": f"Bearer {GLOBAL_KEY}"}, 200),
        ({"x-api-key": GLOBAL_KEY, "authorization": f"Bearer {GLOBAL_KEY}"}, 200),
        ({"x-api-key": GLOBAL_KEY, "authorization": "Bearer sk-wrong"}, 401),
        ({"x-api-key": "sk-wrong", "authorization": f"Bearer {GLOBAL_KEY}"}, 401),
        ({"x-api-key": GLOBAL_KEY, "authorization": f"Bearer {SMALL_KEY}"}, 401),
        ({"x-api-key": GLOBAL_KEY, "authorization": ""}, 401),
        ({"x-api-key": "", "authorization": f"Bearer {GLOBAL_KEY}"}, 401),
    ],
)
def test_two_keys_that_differ_are_refused_whichever_is_valid(
    gw: RunningGateway, headers: dict[str, str], status: int
) -> None:
    """A door that takes Anthropic's x-api-key as well as Authorization never ignores one of two
    keys sent: they must be the same."""
    for path in ("/v1/models", "/v1/messages/count_tokens"):
        sent = {"anthropic-version": "2023-06-01", **headers}
        body = {"model": "meridian-small", "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.request(
            "GET" if path == "/v1/models" else "POST", gw.url + path, headers=sent, timeout=30,
            json=None if path == "/v1/models" else body,
        )  # fmt: skip
        assert response.status_code == status, (path, response.text)
        if status == 401:
            assert response.json()["error"]["type"] == "authentication_error"


def test_bad_or_missing_key_is_401_in_openai_format(gw: RunningGateway) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        sdk(gw, "sk-wrong").chat.completions.create(
            model="meridian-small", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.code == "invalid_api_key"
    assert info.value.response.headers.get("x-request-id")
    missing = httpx.post(gw.url + "/v1/chat/completions", json={"model": "meridian-small", "messages": []})
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "invalid_request_error"


def test_model_outside_the_tenant_policy_is_403(gw: RunningGateway) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        sdk(gw, SMALL_KEY).chat.completions.create(
            model="meridian-large", messages=[{"role": "user", "content": "x"}], max_tokens=4
        )
    assert info.value.code == "model_not_allowed"


def test_unknown_model_is_404(gw: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk(gw).chat.completions.create(
            model="gpt-17", messages=[{"role": "user", "content": "x"}], max_tokens=4
        )
    assert info.value.code == "model_not_found"
    assert "gpt-17" in info.value.message


def test_over_the_tenant_caps_is_400(gw: RunningGateway) -> None:
    client = sdk(gw, SMALL_KEY)
    with pytest.raises(openai.BadRequestError) as over_max:
        client.chat.completions.create(
            model="meridian-small", messages=[{"role": "user", "content": "x"}], max_tokens=33
        )
    assert over_max.value.code == "max_tokens_exceeded"
    with pytest.raises(openai.BadRequestError) as over_context:
        client.chat.completions.create(
            model="meridian-small", messages=[{"role": "user", "content": "word " * 400}], max_tokens=8
        )
    assert over_context.value.code == "context_length_exceeded"


def test_malformed_bodies_are_400_naming_the_field(gw: RunningGateway) -> None:
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    not_json = httpx.post(gw.url + "/v1/chat/completions", content=b"{nope", headers=headers)
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"
    bad_field = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "meridian-small", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"},
        headers=headers,
    )
    assert bad_field.status_code == 400
    assert bad_field.json()["error"]["param"] == "max_tokens"
    assert bad_field.headers.get("x-request-id")


def test_eu_tenant_is_served_in_the_eu(gw: RunningGateway) -> None:
    for _ in range(4):
        raw = sdk(gw, EU_KEY).chat.completions.with_raw_response.create(
            model="meridian-small", messages=[{"role": "user", "content": "hallo"}], max_tokens=2
        )
        assert raw.headers["x-meridian-region"] == "eu-west"


def test_client_disconnect_cancels_the_node_request(gw: RunningGateway, nodes: list[NodeProcess]) -> None:
    body = {
        "model": "meridian-small",
        "messages": [{"role": "user", "content": "go on forever"}],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        node = next(n for n in nodes if n.node_id == response.headers["x-meridian-node"])
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    # The client is gone: the node must abort the sequence (counted as "disconnected") at once,
    # long before 3000 tokens would have been generated.
    started = time.monotonic()
    while _disconnected(node.metrics()) < 1:
        assert time.monotonic() - started < 3, "the node kept generating for a disconnected client"
        time.sleep(0.05)


def _disconnected(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("meridian_node_requests_total{") and 'outcome="disconnected"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_requests_tokens_and_attempts(gw: RunningGateway) -> None:
    sdk(gw).chat.completions.create(
        model="meridian-small", messages=[{"role": "user", "content": "m"}], max_tokens=3
    )
    text = httpx.get(gw.admin_url + "/metrics").text
    for name in (
        "meridian_gateway_requests_total",
        "meridian_gateway_request_duration_seconds_bucket",
        "meridian_gateway_time_to_first_token_seconds_bucket",
        "meridian_gateway_upstream_attempts_total",
        "meridian_gateway_tokens_total",
        "meridian_gateway_node_ready",
    ):
        assert name in text, name
    assert gw.metric("meridian_gateway_tokens_total", tenant="t-global", kind="completion") >= 3
    health = httpx.get(gw.url + "/health").json()
    assert health["status"] == "ok" and health["healthy_nodes"] == 2


def test_tenant_data_stays_off_the_public_listener(gw: RunningGateway) -> None:
    """Issue 32: /metrics names every tenant with its tokens and cost, so it is served on the
    admin listener only; the public listener answers it 404, and its /health names no tenant."""
    sdk(gw).chat.completions.create(
        model="meridian-small", messages=[{"role": "user", "content": "m"}], max_tokens=3
    )
    assert 'tenant="t-global"' in httpx.get(gw.admin_url + "/metrics").text
    public = httpx.get(gw.url + "/metrics")
    assert public.status_code == 404 and "t-global" not in public.text
    for path in ("/health", "/ready"):
        answer = httpx.get(gw.url + path)
        assert answer.status_code == 200
        assert not any(tenant.tenant_id in answer.text for tenant in TEST_TENANTS), answer.text

"""The operational endpoints: /health, /ready, /load (what routing reads) and /metrics."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.node.conftest import CHAT_MODEL, SMALL_POOL_BLOCKS, SMALL_POOL_MODEL, Node


def test_ready_reports_loaded_models(http: httpx.Client) -> None:
    response = http.get("/ready")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"


def test_load_reports_identity_aggregates_and_per_model(node: Node) -> None:
    load = node.load()
    assert (load["node_id"], load["region"], load["jurisdiction"]) == ("test-node", "eu-west", "eu")
    assert load["ready"] is True
    assert load["models"] == [
        {"name": CHAT_MODEL, "tier": "small"},
        {"name": SMALL_POOL_MODEL, "tier": "large"},
    ]
    for key in ("kv_cache_usage", "waiting_tokens", "num_running", "num_waiting", "prefix_cache_hit_rate"):
        assert isinstance(load[key], int | float)
    per_model = load["per_model"]
    assert per_model[SMALL_POOL_MODEL]["kv_blocks_total"] == SMALL_POOL_BLOCKS
    assert per_model[SMALL_POOL_MODEL]["tier"] == "large"
    assert load["kv_blocks_total"] == sum(m["kv_blocks_total"] for m in per_model.values())


def _samples(text: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def test_metrics_cover_latency_tokens_and_engine_state(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/completions",
        json={"model": CHAT_MODEL, "prompt": "Count", "max_tokens": 4, "ignore_eos": True},
        headers={"x-meridian-tenant": "acme", "x-meridian-priority": "batch", "x-meridian-cache-salt": "s1"},
    )
    assert reply.status_code == 200
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    families = {family.name for family in text_string_to_metric_families(response.text)}
    for histogram in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "decode_seconds",
    ):
        assert f"meridian_node_{histogram}_bucket" in samples, histogram
    assert {"meridian_node_queue_wait_seconds", "meridian_node_prefill_seconds"} <= families
    for histogram in ("queue_wait_seconds", "prefill_seconds"):
        counts = [
            s.value for s in samples[f"meridian_node_{histogram}_count"] if s.labels["model"] == CHAT_MODEL
        ]
        assert counts and counts[0] >= 1, histogram
    for name in (
        "meridian_node_num_requests_running",
        "meridian_node_num_requests_waiting",
        "meridian_node_kv_cache_usage_ratio",
        "meridian_node_prefix_cache_query_tokens_total",
        "meridian_node_prefix_cache_hit_tokens_total",
        "meridian_node_num_preemptions_total",
    ):
        assert name in samples, name
    generated = {
        s.labels["tenant"]: s.value
        for s in samples["meridian_node_generation_tokens_total"]
        if s.labels["model"] == CHAT_MODEL
    }
    assert generated.get("acme") == 4
    ttft = [
        s
        for s in samples["meridian_node_time_to_first_token_seconds_count"]
        if s.labels["model"] == CHAT_MODEL
    ]
    assert ttft and ttft[0].value >= 1


def test_response_headers_name_request_and_node(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"model": CHAT_MODEL, "prompt": "x", "max_tokens": 1})
    assert response.headers["x-request-id"] == response.json()["id"]
    assert response.headers["x-meridian-node"] == "test-node"


def test_stream_has_sse_headers(http: httpx.Client) -> None:
    body = {"model": CHAT_MODEL, "prompt": "x", "max_tokens": 2, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"

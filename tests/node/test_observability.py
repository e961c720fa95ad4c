"""What a node tells the outside about latency: vLLM's metric contract on /metrics, and the
per-request breakdown (Server-Timing header; the usage chunk's `timings` extension on streams)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from protocol.timing import parse_server_timing
from regional_node.server.vllm_metrics import INTER_TOKEN_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from tests.node.conftest import CHAT_MODEL, Node

# name -> (type, vLLM's buckets for histograms)
CONTRACT: dict[str, tuple[str, tuple[float, ...] | None]] = {
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:prefix_cache_queries": ("counter", None),
    "vllm:prefix_cache_hits": ("counter", None),
    "vllm:num_preemptions": ("counter", None),
    "vllm:prompt_tokens": ("counter", None),
    "vllm:generation_tokens": ("counter", None),
    "vllm:time_to_first_token_seconds": ("histogram", TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": ("histogram", INTER_TOKEN_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
    "vllm:request_queue_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
    "vllm:request_prefill_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
    "vllm:request_decode_time_seconds": ("histogram", REQUEST_LATENCY_BUCKETS),
    "vllm:cache_config_info": ("gauge", None),
}


def scrape(http: httpx.Client) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """family -> {(sample name, sorted labels): value}"""
    families = text_string_to_metric_families(http.get("/metrics").text)
    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    types: dict[str, str] = {}
    for family in families:
        types[family.name] = family.type
        out[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    out["__types__"] = {(name, ()): 0.0 for name in (f"{n}={t}" for n, t in types.items())}
    return out


def model_value(samples: dict, sample_name: str, **labels: str) -> float:
    return sum(
        value
        for (name, pairs), value in samples.items()
        if name == sample_name and all(dict(pairs).get(k) == v for k, v in labels.items())
    )


def chat(http: httpx.Client, *, stream: bool = False, max_tokens: int = 8, **extra: object) -> httpx.Response:
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Tell me about the sea"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    return http.post("/v1/chat/completions", json=body)


def test_every_contract_metric_is_exported_with_vllm_type_labels_and_buckets(http: httpx.Client) -> None:
    chat(http)  # the histograms have a series once a request finished
    scraped = scrape(http)
    types = dict(entry[0].split("=") for entry in scraped["__types__"])
    for name, (kind, buckets) in CONTRACT.items():
        assert types.get(name) == kind, f"{name}: {types.get(name)}"
        samples = scraped[name]
        assert samples, name
        for _, pairs in samples:
            labels = dict(pairs)
            if name != "vllm:cache_config_info":
                assert set(labels) - {"le"} == {"model_name", "engine"}, (name, labels)
        assert any(dict(pairs).get("model_name") == CHAT_MODEL for _, pairs in samples) or (
            name == "vllm:cache_config_info"
        ), name
        if buckets is not None:
            bounds = sorted(
                float(dict(pairs)["le"])
                for sample, pairs in samples
                if sample == f"{name}_bucket" and dict(pairs)["model_name"] == CHAT_MODEL
            )
            assert bounds == [*buckets, float("inf")], name


def test_cache_config_info_is_one_per_model_with_the_cache_settings(http: httpx.Client) -> None:
    samples = scrape(http)["vllm:cache_config_info"]
    assert len(samples) == 2  # the two models of the test node
    for (_, pairs), value in samples.items():
        labels = dict(pairs)
        assert value == 1.0
        assert labels["engine"] == "0"
        assert labels["block_size"] == "16"
        assert labels["enable_prefix_caching"] == "True"
        assert int(labels["num_gpu_blocks"]) > 0


def test_contract_values_move_under_load(http: httpx.Client, node: Node) -> None:
    before = scrape(http)
    # The gauges, read while a request runs: a long stream whose first token has arrived, tried
    # again until a scrape lands inside one (on a busy machine a scrape can take longer than a
    # tiny model's whole generation, and a burst of short requests can all end between scrapes).
    running_seen = kv_seen = 0.0
    long_stream = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Tell me about the sea"}],
        "max_tokens": 3500,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    deadline = time.monotonic() + 120
    while (running_seen < 1 or kv_seen <= 0) and time.monotonic() < deadline:
        with node.http() as client, client.stream("POST", "/v1/chat/completions", json=long_stream) as stream:
            assert stream.status_code == 200
            next(line for line in stream.iter_lines() if line.startswith("data:"))
            live = scrape(http)  # closing the stream then aborts the request, if it still runs
        running = model_value(
            live["vllm:num_requests_running"], "vllm:num_requests_running", model_name=CHAT_MODEL
        )
        kv = model_value(live["vllm:kv_cache_usage_perc"], "vllm:kv_cache_usage_perc", model_name=CHAT_MODEL)
        running_seen, kv_seen = max(running_seen, running), max(kv_seen, kv)
    assert running_seen >= 1
    assert 0 < kv_seen <= 1  # KV use is a fraction of the pool, never a percentage

    requests, max_tokens = 12, 48

    def one() -> int:
        with node.http() as client:
            return chat(client, max_tokens=max_tokens).status_code

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(lambda _: one(), range(requests))) == [200] * requests
    after = scrape(http)

    def grew(name: str, sample: str) -> float:
        return model_value(after[name], sample, model_name=CHAT_MODEL) - model_value(
            before[name], sample, model_name=CHAT_MODEL
        )

    for name in ("vllm:prompt_tokens", "vllm:prefix_cache_queries"):
        assert grew(name, f"{name}_total") > 0, name
    assert grew("vllm:generation_tokens", "vllm:generation_tokens_total") >= requests * max_tokens
    for name in (
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:time_to_first_token_seconds",
    ):
        assert grew(name, f"{name}_count") >= requests, name
    gaps = "vllm:inter_token_latency_seconds"
    assert grew(gaps, f"{gaps}_count") >= requests * (max_tokens - 1)


def test_a_non_streamed_answer_carries_the_whole_breakdown_in_server_timing(http: httpx.Client) -> None:
    response = chat(http, max_tokens=12)
    assert response.status_code == 200
    timing = parse_server_timing(response.headers["server-timing"])
    assert timing.queue is not None and timing.prefill is not None and timing.decode is not None
    assert timing.total is not None
    assert timing.queue + timing.prefill + timing.decode <= timing.total * 1.01 + 0.001
    assert timing.decode > 0
    assert timing.gateway is None  # the node is no gateway


def test_a_stream_has_queue_prefill_and_its_prompt_count_in_headers_and_the_breakdown_in_its_usage_chunk(
    node: Node,
) -> None:
    with (
        node.http() as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": CHAT_MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 10,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as response,
    ):
        header = parse_server_timing(response.headers["server-timing"])
        counted = (response.headers["x-meridian-prompt-tokens"], response.headers["x-meridian-cached-tokens"])
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert header.queue is not None and header.prefill is not None
    assert header.decode is None and header.total is None  # not known at the first byte
    usage_chunk = events[-1]
    # The prompt as counted is known at the first byte too (the gateway's message_start needs it).
    usage = usage_chunk["usage"]
    assert counted == (str(usage["prompt_tokens"]), str(usage["prompt_tokens_details"]["cached_tokens"]))
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 10
    timings = usage_chunk["timings"]
    assert set(timings) == {"queue_ms", "prefill_ms", "decode_ms", "total_ms"}
    assert abs(timings["queue_ms"] - header.queue * 1000) < 0.01  # the same engine split
    assert timings["decode_ms"] > 0 and timings["total_ms"] >= timings["decode_ms"]
    assert all("timings" not in event for event in events[:-1])


def test_a_stream_without_include_usage_has_no_extension_field(node: Node) -> None:
    with (
        node.http() as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": CHAT_MODEL,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "stream": True,
            },
        ) as response,
    ):
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert events and all("timings" not in event for event in events)

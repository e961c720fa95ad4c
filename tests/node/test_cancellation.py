"""A client that goes away stops its generation: the engine frees its KV blocks at once."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.node.conftest import CHAT_MODEL, Node

LONG = {"model": CHAT_MODEL, "max_tokens": 4000, "temperature": 0, "ignore_eos": True}


def _generated(node: Node) -> float:
    """The tokens the chat model's engine has generated so far (vLLM's counter on the node)."""
    metrics = httpx.get(f"{node.url}/metrics", headers=node.headers).text
    return sum(
        s.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "vllm:generation_tokens"
        for s in family.samples
        if s.name.endswith("_total") and s.labels.get("model_name") == CHAT_MODEL
    )


def _wait_idle(node: Node, within: float = 30.0) -> dict:
    """The engine idle again, every block back. Generous: a loaded 2-core box may be slow to
    notice; that the request was aborted, not run to its end, is checked by what it generated."""
    deadline = time.monotonic() + within
    while True:
        load = node.load()
        if load["num_running"] == 0 and load["num_waiting"] == 0 and load["kv_blocks_used"] == 0:
            return load
        if time.monotonic() > deadline:
            pytest.fail(f"engine still busy {within}s after the client left: {load}")
        time.sleep(0.02)


def test_disconnect_mid_stream_frees_kv_blocks(node: Node) -> None:
    body = {**LONG, "messages": [{"role": "user", "content": "Go on forever."}], "stream": True}
    with httpx.Client(base_url=node.url, headers=node.headers, timeout=30.0) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            received = [line for _, line in zip(range(8), lines, strict=False)]
            assert any(line.startswith("data: ") for line in received)
            busy = node.load()
            assert busy["num_running"] == 1 and busy["kv_blocks_used"] > 0
        # Leaving the block closes the connection mid-stream.
    _wait_idle(node)


def test_disconnect_while_waiting_for_a_full_response_aborts_it(node: Node) -> None:
    body = {**LONG, "prompt": "Keep writing"}
    before = _generated(node)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{node.url}/v1/completions",
            json=body,
            headers=node.headers,
            timeout=httpx.Timeout(5.0, read=0.5),
        )
    _wait_idle(node)
    generated = _generated(node) - before
    assert 0 < generated < LONG["max_tokens"]  # it ran for the half second, then was aborted
    metrics = httpx.get(f"{node.url}/metrics", headers=node.headers).text
    samples = {
        (s.labels.get("endpoint"), s.labels.get("outcome")): s.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "meridian_node_requests"
        for s in family.samples
        if s.name.endswith("_total") and s.labels.get("model") == CHAT_MODEL
    }
    assert samples.get(("completions", "disconnected"), 0) >= 1


def test_node_serves_normally_after_disconnects(node: Node) -> None:
    with node.client() as client:
        reply = client.completions.create(model=CHAT_MODEL, prompt="Hello", max_tokens=3)
    assert reply.usage.completion_tokens >= 1

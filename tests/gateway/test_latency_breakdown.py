"""The latency breakdown on every response, through a real gateway and node: Server-Timing
(gateway, queue, prefill, decode, total), the stream's usage-chunk `timings` field, and
meridian_gateway_overhead_seconds."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol.timing import Timing, parse_server_timing
from tests.gateway.conftest import GLOBAL_KEY, NodeProcess, RunningGateway, gateway_over, running_fleet

HEADERS = {"authorization": f"Bearer {GLOBAL_KEY}"}


@pytest.fixture(scope="module")
def nodes(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    models = {"meridian-small": (llama_checkpoint, "small")}
    with running_fleet([("eu-west-1", "eu-west", "eu")], models, tmp_path_factory.mktemp("logs")) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def gw(nodes: list[NodeProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway_over(nodes, tmp_path_factory.mktemp("gw")) as running:
        yield running


def chat_body(*, stream: bool, max_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    return {
        "model": "meridian-small",
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
        **extra,
    }


def streamed(
    gw: RunningGateway, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[Timing, list[Any]]:
    with httpx.stream("POST", gw.url + path, json=body, headers=HEADERS, timeout=30) as response:
        assert response.status_code == 200
        header = parse_server_timing(response.headers.get("server-timing"))
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    return header, events


def test_a_non_streamed_answer_has_every_part_in_server_timing(gw: RunningGateway) -> None:
    response = httpx.post(
        gw.url + "/v1/chat/completions", json=chat_body(stream=False), headers=HEADERS, timeout=30
    )
    assert response.status_code == 200
    timing = parse_server_timing(response.headers["server-timing"])
    parts = (timing.gateway, timing.queue, timing.prefill, timing.decode, timing.total)
    assert all(part is not None for part in parts), timing
    assert timing.decode > 0  # type: ignore[operator]
    # The node's parts happened inside the gateway's wait on it.
    assert timing.gateway + timing.queue + timing.prefill + timing.decode <= timing.total * 1.001 + 1e-4  # type: ignore[operator]
    assert "timings" not in response.json()  # the node's report is taken out of the body


def test_a_stream_says_what_it_knows_at_first_byte_and_the_rest_in_its_usage_chunk(
    gw: RunningGateway,
) -> None:
    header, events = streamed(gw, chat_body(stream=True, stream_options={"include_usage": True}))
    assert header.gateway is not None and header.queue is not None and header.prefill is not None
    assert header.decode is None and header.total is None
    usage_chunk = events[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 12
    timings = usage_chunk["timings"]
    assert set(timings) == {"gateway_ms", "queue_ms", "prefill_ms", "decode_ms", "total_ms"}
    assert timings["decode_ms"] > 0
    # The gateway relays while the node decodes, so on a stream only the node's parts add up.
    assert timings["queue_ms"] + timings["prefill_ms"] + timings["decode_ms"] <= timings["total_ms"] * 1.001
    assert timings["gateway_ms"] <= timings["total_ms"]
    assert all("timings" not in event for event in events[:-1])


def test_a_stream_without_usage_carries_no_timings_field(gw: RunningGateway) -> None:
    _, events = streamed(gw, chat_body(stream=True))
    assert events and all("timings" not in event and "usage" not in event for event in events)


def test_errors_carry_server_timing_too(gw: RunningGateway) -> None:
    response = httpx.post(gw.url + "/v1/chat/completions", json=chat_body(stream=False), timeout=30)
    assert response.status_code == 401
    timing = parse_server_timing(response.headers["server-timing"])
    assert timing.gateway is not None and timing.total is not None and timing.queue is None


def test_messages_front_door_has_the_same_headers(gw: RunningGateway) -> None:
    body = {"model": "meridian-small", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    response = httpx.post(gw.url + "/v1/messages", json=body, headers=HEADERS, timeout=30)
    assert response.status_code == 200
    timing = parse_server_timing(response.headers["server-timing"])
    assert timing.decode is not None and timing.total is not None and timing.gateway is not None
    with httpx.stream(
        "POST", gw.url + "/v1/messages", json={**body, "stream": True}, headers=HEADERS, timeout=30
    ) as streamed_response:
        first_byte = parse_server_timing(streamed_response.headers["server-timing"])
        streamed_response.read()
    assert first_byte.prefill is not None and first_byte.gateway is not None


def test_overhead_histogram_counts_every_request_and_stays_below_the_total(gw: RunningGateway) -> None:
    def count(stream: str) -> float:
        return gw.metric("meridian_gateway_overhead_seconds_count", model="meridian-small", stream=stream)

    # An earlier test's stream is recorded as its response closes, maybe after that test ended:
    # start counting once the count holds still.
    before = {"true": count("true"), "false": count("false")}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.2)
        settled = {"true": count("true"), "false": count("false")}
        if settled == before:
            break
        before = settled
    for _ in range(3):
        httpx.post(gw.url + "/v1/chat/completions", json=chat_body(stream=False), headers=HEADERS, timeout=30)
        streamed(gw, chat_body(stream=True))
    assert count("false") == before["false"] + 3
    # A stream is recorded as its response closes, which may come just after the client's last read.
    deadline = time.monotonic() + 10
    while count("true") < before["true"] + 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert count("true") == before["true"] + 3
    for stream in ("true", "false"):
        overhead = gw.metric("meridian_gateway_overhead_seconds_sum", model="meridian-small", stream=stream)
        total = gw.metric(
            "meridian_gateway_request_duration_seconds_sum", model="meridian-small", stream=stream
        )
        assert 0 < overhead < total

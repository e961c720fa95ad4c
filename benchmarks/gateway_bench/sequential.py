"""The independent overhead method, as public gateway comparisons measure it.

Sequential non-streamed requests to the mock upstream through each system, one after another on
one keep-alive connection of a stock client (httpx, not the benchmark's own load generator); each
round takes the median latency of every system's block of requests; a system's latency is the
median of its round medians, and its overhead is that minus the upstream's own (`direct`). The
systems take their blocks in an order that rotates every round, so a noisy spell on the shared
machine lands on each of them in turn; the median of medians then drops the round it spoiled.

It differs from the main method on purpose: another client, whole blocks instead of interleaved
turns of 20, and a median of medians instead of one pooled p50. Where both agree, neither is an
artefact of how it was measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx

from gateway_bench.load import PROMPT
from gateway_bench.systems import System

WARMUP = 20  # unrecorded requests before each block: the connection opens, the system wakes


def _block(system: System, requests: int, timeout_s: float) -> list[float]:
    """`requests` sequential chat requests through `system`: each one's latency in seconds."""
    headers = {"content-type": "application/json"}
    if system.api_key:
        headers["authorization"] = f"Bearer {system.api_key}"
    body = {"model": system.model, "messages": PROMPT, "max_tokens": 16}
    latencies = []
    with httpx.Client(base_url=system.base_url, headers=headers, timeout=timeout_s) as client:
        for index in range(WARMUP + requests):
            started = time.perf_counter()
            response = client.post("/v1/chat/completions", json=body)
            elapsed = time.perf_counter() - started
            if response.status_code != 200 or not response.json().get("choices"):
                raise RuntimeError(f"{system.name}: {response.status_code} {response.text[:200]}")
            if index >= WARMUP:
                latencies.append(elapsed)
    return latencies


def measure_sequential(
    systems: Sequence[System], *, rounds: int, requests: int, timeout_s: float = 30.0, progress: bool = True
) -> dict[str, Any]:
    """Round medians per system, their median, and the overhead over `direct`, in ms."""
    taking_part = [s for s in systems if s.only_phases is None]  # the one-worker systems
    medians: dict[str, list[float]] = {s.name: [] for s in taking_part}
    for index in range(rounds):
        shift = index % len(taking_part)
        for system in [*taking_part[shift:], *taking_part[:shift]]:
            median = statistics.median(_block(system, requests, timeout_s)) * 1000
            medians[system.name].append(round(median, 3))
            if progress:
                print(
                    f"  sequential round {index + 1}/{rounds} {system.name:<9} median {median:.3f} ms",
                    flush=True,
                )
    latency = {name: round(statistics.median(values), 3) for name, values in medians.items()}
    overhead = {
        name: round(value - latency["direct"], 3) for name, value in latency.items() if name != "direct"
    }
    result: dict[str, Any] = {
        "method": "sequential non-streamed requests on one keep-alive httpx connection per block; "
        "median of each round's block, median of the round medians, minus direct's",
        "rounds": rounds,
        "requests_per_round": requests,
        "round_medians_ms": medians,
        "latency_ms": latency,
        "overhead_ms": overhead,
    }
    if "litellm" in overhead and overhead.get("meridian", 0) > 0:
        result["litellm_to_meridian_overhead_ratio"] = round(overhead["litellm"] / overhead["meridian"], 2)
    return result


def sequential_lines(result: dict[str, Any]) -> list[str]:
    """The printed table's lines for the independent method."""
    lines = [
        f"independent method (sequential, median of {result['rounds']} round medians of "
        f"{result['requests_per_round']} requests, minus direct):"
    ]
    for name, value in result["overhead_ms"].items():
        lines.append(f"  {name:<20} overhead {value:8.3f} ms   (latency {result['latency_ms'][name]:.3f} ms)")
    if "litellm_to_meridian_overhead_ratio" in result:
        lines.append(f"  litellm / meridian overhead: {result['litellm_to_meridian_overhead_ratio']:.1f}x")
    return lines

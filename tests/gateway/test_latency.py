"""Latency, the call's breakdown: pure arithmetic over what the request path reported."""

from __future__ import annotations

from gateway.call.latency import Latency
from protocol.timing import Timing


def finished(upstream_s: float, *reports: Timing) -> Latency:
    latency = Latency(started=100.0)
    latency.upstream_s = upstream_s
    for report in reports:
        latency.answered(report)
    latency.ended = 101.0
    return latency


def test_gateway_overhead_is_the_total_minus_the_upstream_wait() -> None:
    latency = finished(0.75, Timing(queue=0.1, prefill=0.2, decode=0.4, total=0.72))
    assert latency.total_s == 1.0
    assert abs(latency.gateway_s - 0.25) < 1e-9
    assert latency.timing() == Timing(
        gateway=latency.gateway_s, queue=0.1, prefill=0.2, decode=0.4, total=1.0
    )


def test_overhead_is_never_negative() -> None:
    assert finished(1.5).gateway_s == 0.0


def test_a_continuation_adds_its_queue_prefill_and_decode_to_the_first_upstreams() -> None:
    latency = finished(
        0.9, Timing(queue=0.1, prefill=0.2, decode=0.3), Timing(queue=0.01, prefill=0.02, decode=0.2)
    )
    assert abs(latency.queue_s - 0.11) < 1e-9  # type: ignore[operator]
    assert abs(latency.prefill_s - 0.22) < 1e-9  # type: ignore[operator]
    assert abs(latency.decode_s - 0.5) < 1e-9  # type: ignore[operator]


def test_a_final_report_replaces_the_first_byte_one_of_the_same_upstream() -> None:
    latency = finished(0.5, Timing(queue=0.1, prefill=0.2))
    latency.finished_upstream(Timing(queue=0.1, prefill=0.2, decode=0.3, total=0.6))
    assert latency.upstreams == [Timing(queue=0.1, prefill=0.2, decode=0.3, total=0.6)]


def test_parts_no_upstream_reported_stay_unknown() -> None:
    latency = finished(0.5, Timing())  # a provider: no breakdown of its own
    timing = latency.timing()
    assert timing.queue is None and timing.prefill is None and timing.decode is None
    assert timing.gateway is not None and timing.total == 1.0
    assert latency.at_first_byte() == Timing(gateway=latency.gateway_s)

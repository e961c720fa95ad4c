"""The latency breakdown's two carriers: the Server-Timing header and the `timings` field."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.timing import Timing, parse_server_timing, timing_from_wire

durations = st.one_of(st.none(), st.floats(min_value=0, max_value=10_000, allow_nan=False))


def test_server_timing_lists_known_parts_in_order_in_milliseconds() -> None:
    timing = Timing(gateway=0.0004, prefill=0.035, total=0.5)
    assert timing.server_timing() == "gateway;dur=0.40, prefill;dur=35.00, total;dur=500.00"
    assert Timing().server_timing() == ""


def test_the_wire_field_holds_milliseconds_of_known_parts_only() -> None:
    assert Timing(queue=0.002, decode=1.5).to_wire() == {"queue_ms": 2.0, "decode_ms": 1500.0}


@given(st.tuples(durations, durations, durations, durations, durations))
def test_both_carriers_round_trip(values: tuple[float | None, ...]) -> None:
    timing = Timing(**dict(zip(("gateway", "queue", "prefill", "decode", "total"), values, strict=True)))
    for parsed in (parse_server_timing(timing.server_timing()), timing_from_wire(timing.to_wire())):
        for part in ("gateway", "queue", "prefill", "decode", "total"):
            sent, got = getattr(timing, part), getattr(parsed, part)
            assert (sent is None) == (got is None)
            if sent is not None:
                assert abs(sent - got) <= 0.00001 + sent * 1e-9


def test_readers_ignore_other_metrics_descriptions_and_junk() -> None:
    header = 'cache;desc="hit", db;dur=53, queue;desc="q";dur=1.5, prefill;dur=abc, total;dur="20"'
    assert parse_server_timing(header) == Timing(queue=0.0015, total=0.02)
    assert parse_server_timing(None) == Timing()
    assert timing_from_wire({"queue_ms": "1", "decode_ms": -1, "total_ms": True, "prefill_ms": 3}) == Timing(
        prefill=0.003
    )
    assert timing_from_wire([1, 2]) == Timing()

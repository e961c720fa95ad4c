"""benchmarks/tracing.py runs end to end (upstream, Meridian untraced and traced, a local OTLP
receiver) with tiny counts and writes the expected JSON. No timing assertions: this keeps the
benchmark from rotting, and checks the traced gateway really exported a trace per request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_tracing_benchmark_measures_both_gateways_and_counts_the_exported_traces(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tracing  # benchmarks/tracing.py, imported as the script imports its own parts

    out = tmp_path / "tracing.json"
    tiny = ["--requests-c1", "5", "--requests-c32", "40", "--streams", "5", "--streams-c32", "40"]
    assert (
        tracing.main(
            [
                *tiny,
                "--warmup",
                "4",
                "--rounds",
                "1",
                "--ratio",
                "0.5",
                "--deadline-s",
                "60",
                "--out",
                str(out),
            ]
        )
        == 0
    )

    result = json.loads(out.read_text())
    assert set(result) == {"conditions", "systems", "tracing_cost", "receiver"}
    assert set(result["systems"]) == {"meridian", "meridian_traced", "meridian_sampled"}
    for system in result["systems"].values():
        assert set(system) == {"chat_c1", "chat_c32", "stream_c1", "stream_c32"}
        assert all(phase["errors"] == 0 for phase in system.values())
    assert set(result["tracing_cost"]) == {"meridian_traced", "meridian_sampled"}
    for costs in result["tracing_cost"].values():
        for cost in costs.values():
            assert {"latency_p50_ms", "proxy_cpu_ms_per_request", "cpu_increase_pct"} <= set(cost)
    measured = sum(phase["requests"] for phase in result["systems"]["meridian_traced"].values())
    # Every traced request's server span reached the receiver (warm-up requests add more).
    assert result["receiver"]["server_spans"] >= measured
    assert "cost" in capsys.readouterr().out

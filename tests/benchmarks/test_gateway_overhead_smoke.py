"""benchmarks/gateway_overhead.py runs end to end (upstream + Meridian, no LiteLLM) with tiny counts
and writes the expected JSON.

No timing assertions: this only keeps the benchmark from rotting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PHASES = {"chat_c1", "chat_c32", "stream_c1"}
PHASE_KEYS = {
    "requests",
    "errors",
    "truncated",
    "latency_p50_ms",
    "latency_p99_ms",
    "requests_per_s",
    "client_cpu_fraction",
    "proxy_cpu_ms_per_request",
    "per_round",
}
ADDED_KEYS = {
    "chat_c1_latency_p50_ms",
    "chat_c1_latency_p99_ms",
    "chat_c32_latency_p50_ms",
    "chat_c32_latency_p99_ms",
    "stream_c1_ttfb_p50_ms",
    "stream_c1_ttfb_p99_ms",
}


@pytest.fixture
def gateway_overhead(monkeypatch: pytest.MonkeyPatch):
    # The script imports its parts as `gateway_bench.*`, as it does when run from benchmarks/; the
    # processes it starts get benchmarks/ on their PYTHONPATH themselves.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gateway_overhead

    return gateway_overhead


# About 6 s (two server processes and six load-generator processes), so not marked slow.
def test_main_measures_direct_and_meridian_and_writes_every_key(
    gateway_overhead, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gateway_overhead.json"
    tiny = ["--requests-c1", "5", "--requests-c32", "40", "--streams", "5", "--warmup", "4", "--rounds", "1"]
    assert gateway_overhead.main([*tiny, "--deadline-s", "60", "--out", str(out)]) == 0

    result = json.loads(out.read_text())
    assert set(result) == {"conditions", "systems", "added_latency_ms", "comparison"}
    conditions = {
        "cpu_count",
        "loadavg_before",
        "loadavg_after",
        "versions",
        "phases",
        "meridian_source_sha256",
    }
    assert conditions <= set(result["conditions"])
    assert set(result["systems"]) == {"direct", "meridian"}
    for system in result["systems"].values():
        assert set(system) == PHASES
        for phase in system.values():
            assert PHASE_KEYS <= set(phase)
            assert phase["errors"] == 0
        assert system["chat_c1"]["requests"] == 5
        assert system["chat_c32"]["requests"] == 40
        assert {"ttfb_p50_ms", "ttfb_p99_ms"} <= set(system["stream_c1"])
    assert set(result["added_latency_ms"]) == {"meridian"}
    assert set(result["added_latency_ms"]["meridian"]) == ADDED_KEYS
    assert result["comparison"] is None  # only with --compare-litellm
    assert "meridian" in capsys.readouterr().out

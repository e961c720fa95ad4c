"""benchmarks/gateway_overhead.py runs end to end (upstream + Meridian, no LiteLLM) with tiny counts
and writes the expected JSON.

No timing assertions: this only keeps the benchmark from rotting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PHASES = {"chat_c1", "chat_c32", "stream_c1", "stream_c32", "stream_c32_long"}
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


GOALS = {
    "chat_c1_added_latency_p50_ms",
    "chat_c32_requests_per_s",
    "stream_c32_streams_per_s",
    "chat_c32_cpu_ms_per_request",
    "cpu_ms_per_relayed_chunk",
    "rss_mb_after_all_requests",
    "rss_growth_mb_second_half",
}


# Each phase a handful of requests, one round: enough to run every code path.
TINY = ["--requests-c1", "5", "--requests-c32", "40", "--streams", "5", "--streams-c32", "40"]
TINY += ["--warmup", "4", "--rounds", "1", "--deadline-s", "60"]


# About 15 s (three server processes, one with two workers, and a dozen load-generator
# processes), so not marked slow.
def test_main_measures_direct_and_meridian_and_writes_every_key(
    gateway_overhead, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gateway_overhead.json"
    more = ["--rss-requests", "200", "--workers", "2"]
    more += ["--sequential-requests", "5", "--sequential-rounds", "2"]
    assert gateway_overhead.main([*TINY, *more, "--out", str(out)]) == 0

    result = json.loads(out.read_text())
    assert set(result) == {
        "conditions",
        "systems",
        "added_latency_ms",
        "scaling",
        "rss",
        "cpu_ms_per_relayed_chunk",
        "goals",
        "comparison",
        "sequential_overhead",
    }
    conditions = {
        "cpu_count",
        "loadavg_before",
        "loadavg_after",
        "versions",
        "phases",
        "meridian_source_sha256",
    }
    assert conditions <= set(result["conditions"])
    assert set(result["systems"]) == {"direct", "meridian", "meridian_w2"}
    workers = result["systems"].pop("meridian_w2")
    assert set(workers) == {"chat_c32", "stream_c32"}  # scaling is measured at concurrency 32 only
    for system in [*result["systems"].values(), workers]:
        for phase in system.values():
            assert PHASE_KEYS <= set(phase)
            assert phase["errors"] == 0
        assert system["chat_c32"]["requests"] == 40
        assert system["stream_c32"]["requests"] == 40
    for system in result["systems"].values():
        assert set(system) == PHASES
        assert system["chat_c1"]["requests"] == 5
        assert {"ttfb_p50_ms", "ttfb_p99_ms"} <= set(system["stream_c1"])
    assert set(result["added_latency_ms"]) == {"meridian"}
    assert set(result["added_latency_ms"]["meridian"]) == ADDED_KEYS
    assert result["scaling"]["workers"] == 2
    assert result["scaling"]["chat_c32"]["requests_per_s_2_workers"] > 0
    rss = result["rss"]
    assert (rss["requests"], rss["errors"], rss["truncated"]) == (200, 0, False)
    assert all(rss[f"rss_mb_{when}"] > 10 for when in ("start", "after_first_half", "after_second_half"))
    assert rss["rss_growth_mb_second_half"] == round(
        rss["rss_mb_after_second_half"] - rss["rss_mb_after_first_half"], 1
    )
    assert set(result["goals"]) == GOALS
    # Long streams minus short ones, per extra chunk: a number for every system measured in both.
    assert set(result["cpu_ms_per_relayed_chunk"]) == {"direct", "meridian", "meridian_w2"}
    assert result["cpu_ms_per_relayed_chunk"]["meridian"] is not None
    assert result["systems"]["meridian"]["stream_c32_long"]["requests"] == 32
    assert all(goal["measured"] is not None for goal in result["goals"].values())
    assert result["comparison"] is None  # only with --compare-litellm
    sequential = result["sequential_overhead"]  # the independent method: one-worker systems only
    assert set(sequential["round_medians_ms"]) == {"direct", "meridian"}
    assert all(len(medians) == 2 for medians in sequential["round_medians_ms"].values())
    assert sequential["overhead_ms"]["meridian"] == round(
        sequential["latency_ms"]["meridian"] - sequential["latency_ms"]["direct"], 3
    )
    printed = capsys.readouterr().out
    assert "meridian" in printed and "scaling chat_c32" in printed and "rss meridian" in printed
    assert "independent method" in printed


def test_without_ledger_measures_the_same_gateway_with_its_ledger_off(
    gateway_overhead, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gateway_overhead.json"
    more = ["--rss-requests", "0", "--sequential-requests", "0", "--without-ledger"]
    assert gateway_overhead.main([*TINY, *more, "--out", str(out)]) == 0

    result = json.loads(out.read_text())
    assert set(result["systems"]) == {"direct", "meridian", "meridian_no_ledger"}
    off = result["systems"]["meridian_no_ledger"]
    assert set(off) == PHASES
    assert all(phase["errors"] == 0 for phase in off.values())
    assert set(result["added_latency_ms"]) == {"meridian", "meridian_no_ledger"}
    assert "meridian_no_ledger" in capsys.readouterr().out

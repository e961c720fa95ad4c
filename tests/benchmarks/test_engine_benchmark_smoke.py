"""benchmarks/engine_throughput.py runs end to end on a tiny checkpoint and writes the expected JSON.

No timing assertions: this only keeps the benchmark from rotting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SUMMARY_KEYS = {
    "output_tokens",
    "wall_s",
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p99_s",
}


@pytest.fixture
def engine_throughput(monkeypatch: pytest.MonkeyPatch):
    # The script imports its parts as `engine_bench.*`, as it does when run from benchmarks/.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import engine_throughput

    return engine_throughput


def test_mixed_scenario_reports_every_system_with_exact_token_counts(
    engine_throughput, llama_checkpoint: Path
) -> None:
    mixed = engine_throughput.mixed_scenario(
        llama_checkpoint,
        num_requests=4,
        seed=0,
        device="cpu",
        dtype="float32",
        prompt_range=(8, 40),
        output_range=(2, 6),
        static_batch_size=2,
    )
    expected_tokens = mixed["workload"]["output_tokens"]["total"]
    assert set(mixed["systems"]) == {"meridian", "hf_static_batching", "hf_continuous_batching"}
    for system in mixed["systems"].values():
        assert SUMMARY_KEYS <= set(system)
        assert system["output_tokens"] == expected_tokens
    assert set(mixed["token_agreement_with_meridian"]) == {"hf_static_batching", "hf_continuous_batching"}


def test_prefix_scenario_reuses_the_cached_system_prompt(engine_throughput, llama_checkpoint: Path) -> None:
    prefix = engine_throughput.prefix_scenario(
        llama_checkpoint, num_requests=3, seed=0, device="cpu", dtype="float32", prefix_len=48, max_tokens=2
    )
    assert {"prefix_caching_on", "prefix_caching_off", "ttft_p50_speedup"} <= set(prefix)
    assert prefix["prefix_caching_on"]["details"]["cached_prompt_tokens"] > 0
    assert prefix["prefix_caching_off"]["details"]["cached_prompt_tokens"] == 0


def test_main_writes_json_with_conditions_results_and_targets(
    engine_throughput, llama_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "engine_throughput.json"
    assert engine_throughput.main(["--quick", "--checkpoint", str(llama_checkpoint), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"conditions", "mixed", "prefix", "targets"}
    assert {"device", "dtype", "torch_threads", "checkpoint"} <= set(result["conditions"])
    assert set(result["targets"]) == set(engine_throughput.TARGETS)
    assert "meridian" in capsys.readouterr().out

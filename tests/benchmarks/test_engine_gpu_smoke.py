"""benchmarks/engine_gpu.py: refuses to run without a GPU, and its --device cpu --tiny smoke mode
runs end to end and writes the expected JSON. No timing assertions: this keeps the GPU benchmark
from rotting on machines that cannot run it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def engine_gpu(monkeypatch: pytest.MonkeyPatch):
    # The script imports its parts as `engine_bench.*`, as it does when run from benchmarks/.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import engine_gpu

    return engine_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_cuda_device_it_exits_2_and_says_why(
    engine_gpu, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "engine_gpu.json"
    assert engine_gpu.main(["--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not out.exists()


def test_the_full_workload_on_cpu_is_refused(engine_gpu, capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_gpu.main(["--device", "cpu"]) == 2
    assert "--tiny" in capsys.readouterr().err


def test_unknown_systems_are_refused_and_the_defaults_follow_the_device(engine_gpu) -> None:
    with pytest.raises(SystemExit):
        engine_gpu.parse_args(["--systems", "meridian-torch,vllm"])
    assert engine_gpu.parse_args([]).systems == [*engine_gpu.SYSTEMS, engine_gpu.PEER]
    assert engine_gpu.parse_args(["--device", "cpu"]).systems == ["meridian-torch", engine_gpu.PEER]


def test_the_benchmark_model_has_qwen25_05b_shape(engine_gpu) -> None:
    shape = engine_gpu.QWEN25_05B
    params = shape.parameter_count(arch="qwen2", tied=True)
    assert 490e6 < params < 500e6  # Qwen2.5-0.5B: 494M parameters
    assert shape.head_dim == 64


def test_tiny_cpu_run_reports_each_system_with_exact_token_counts(
    engine_gpu, qwen2_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "engine_gpu.json"
    argv = ["--device", "cpu", "--tiny", "--checkpoint", str(qwen2_checkpoint), "--out", str(out)]
    assert engine_gpu.main(argv) == 0
    result = json.loads(out.read_text())
    assert set(result["systems"]) == {"meridian-torch", engine_gpu.PEER}
    expected_tokens = result["workload"]["output_tokens"]["total"]
    for system in result["systems"].values():
        assert system["output_tokens"] == expected_tokens
        assert {"output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s"} <= set(system)
    assert result["systems"]["meridian-torch"]["batch1_itl_p50_s"] > 0
    assert result["conditions"]["device"] == "cpu" and result["conditions"]["dtype"] == "bfloat16"
    with safe_open(str(qwen2_checkpoint / "model.safetensors"), framework="pt") as f:
        numel = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    assert result["model_bytes"] == 2 * numel  # bfloat16
    assert set(result["targets"]) == set(engine_gpu.TARGETS)
    assert "meridian-torch" in capsys.readouterr().out

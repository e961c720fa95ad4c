"""init_checkpoint: determinism, overrides, size bookkeeping and refusal to overwrite."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from regional_node.checkpoints import (
    SIZES,
    CheckpointExistsError,
    VocabularyTooLargeError,
    init_checkpoint,
    write_checkpoint,
)
from regional_node.checkpoints.cli import model_init_main
from tests.support.checkpoints import make_checkpoint


def test_same_seed_gives_byte_identical_weights(tmp_path: Path) -> None:
    a = init_checkpoint(tmp_path / "a", arch="qwen2", size="tiny", seed=3)
    b = init_checkpoint(tmp_path / "b", arch="qwen2", size="tiny", seed=3)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_different_seeds_give_different_weights(tmp_path: Path) -> None:
    a = init_checkpoint(tmp_path / "a", arch="llama", size="tiny", seed=0)
    b = init_checkpoint(tmp_path / "b", arch="llama", size="tiny", seed=1)
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()


def test_tiny_is_written_in_well_under_two_seconds(tmp_path: Path) -> None:
    started = time.perf_counter()
    init_checkpoint(tmp_path / "t", arch="llama", size="tiny", seed=7)
    assert time.perf_counter() - started < 2.0


def test_refuses_to_overwrite_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointExistsError):
        init_checkpoint(tmp_path, arch="llama", size="tiny")
    init_checkpoint(tmp_path, arch="llama", size="tiny", force=True)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    assert (tmp_path / "model.safetensors").exists()


def test_shape_overrides_reach_config_and_weights(tmp_path: Path) -> None:
    path = make_checkpoint(
        tmp_path, "llama", "tiny", num_key_value_heads=4, num_hidden_layers=1, vocab_size=1024
    )
    config = json.loads((path / "config.json").read_text())
    weights = load_file(path / "model.safetensors")
    assert (config["num_key_value_heads"], config["num_hidden_layers"], config["vocab_size"]) == (4, 1, 1024)
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (64, 64)
    assert weights["model.embed_tokens.weight"].shape == (1024, 64)
    assert not any(name.startswith("model.layers.1.") for name in weights)


def test_vocabulary_larger_than_the_corpus_supports_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VocabularyTooLargeError):
        init_checkpoint(tmp_path, arch="llama", size="tiny", vocab_size=50_000)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_parameter_count_formula_matches_the_written_tensors(tmp_path: Path, arch: str) -> None:
    summary = write_checkpoint(tmp_path, arch=arch, size="tiny")
    assert summary.parameters == summary.shape.parameter_count(arch=arch, tied=summary.tied)


def test_every_size_has_gqa_and_a_long_enough_context() -> None:
    for shape in SIZES.values():
        assert shape.num_key_value_heads < shape.num_attention_heads
        assert shape.max_position_embeddings >= 2048


def test_cli_refuses_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ckpt"
    assert model_init_main(["init", str(out), "--arch", "qwen2", "--size", "tiny"]) == 0
    assert "qwen2/tiny" in capsys.readouterr().out
    assert model_init_main(["init", str(out), "--arch", "qwen2", "--size", "tiny"]) == 1
    assert "--force" in capsys.readouterr().err
    assert model_init_main(["init", str(out), "--arch", "qwen2", "--size", "tiny", "--force"]) == 0


def test_module_is_runnable_with_python_dash_m(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "regional_node.checkpoints", "init", str(tmp_path / "m"), "--size", "tiny"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m" / "tokenizer_config.json").exists()

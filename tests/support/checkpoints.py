"""Session-wide random checkpoints (Hugging Face layout) shared by engine, node and gateway tests.

Registered in tests/conftest.py through `pytest_plugins`. Each fixture writes its folder once per
test session; the folders are read-only by convention — a test that needs a variant calls
`make_checkpoint` with its own `tmp_path`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from regional_node.checkpoints import Arch, init_checkpoint


def make_checkpoint(tmp_dir: Path, arch: Arch = "llama", size: str = "tiny", **overrides: int) -> Path:
    """Write a checkpoint under `tmp_dir` and return its folder.

    `overrides` are `init_checkpoint` keywords: `seed`, `vocab_size`, or any shape field such as
    `num_key_value_heads=4` or `num_hidden_layers=1`. The folder name encodes them, so different
    variants can share one `tmp_dir`.
    """
    suffix = "".join(f"-{key}={value}" for key, value in sorted(overrides.items()))
    out_dir = Path(tmp_dir) / f"{arch}-{size}{suffix}"
    return init_checkpoint(out_dir, arch=arch, size=size, force=True, **overrides)


def endless_checkpoint(tmp_dir: Path) -> Path:
    """A tiny Llama that never ends a reply of itself, for tests that must catch a generation
    still running: greedy output runs to `max_tokens`.

    The Responses API has no `ignore_eos`, and the plain tiny Llama's greedy replies end on their
    own within a few hundred tokens, a fraction of a second, so such a test would race the model.
    Here the end-of-sequence tokens' `lm_head` rows are zero: their logit is exactly 0, while the
    largest of the other ~2000 random logits is positive, so argmax never picks them.
    """
    path = init_checkpoint(Path(tmp_dir) / "llama-tiny-endless", arch="llama", size="tiny", force=True)
    eos_ids = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    weights = load_file(path / "model.safetensors")
    weights["lm_head.weight"][eos_ids] = 0.0
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def scale_attention_output(path: Path, factor: float) -> Path:
    """Scale every attention output projection (`o_proj`) of the checkpoint at `path` in place and
    return `path`: the model's next token then depends mostly on the current one, so greedy text
    falls into cycles that prompt lookup predicts. At 0 the output is a pure cycle (long accepted
    runs); at 0.02 attention still decides many tokens (proposals partly accepted, partly rejected).
    """
    weights = load_file(path / "model.safetensors")
    for name in weights:
        if "o_proj" in name:
            weights[name] *= factor
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Llama (hidden 64, 2 layers, 4 heads / 2 kv heads, vocab 2048, untied lm_head)."""
    return make_checkpoint(tmp_path_factory.mktemp("checkpoints"), "llama", "tiny")


@pytest.fixture(scope="session")
def qwen2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Qwen2 (as tiny Llama, plus q/k/v biases and tied embeddings)."""
    return make_checkpoint(tmp_path_factory.mktemp("checkpoints"), "qwen2", "tiny")


@pytest.fixture(scope="session")
def small_llama_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small Llama (~13M params): the engine benchmark's model; slower, use only where needed."""
    return make_checkpoint(tmp_path_factory.mktemp("checkpoints"), "llama", "small")

"""Session checkpoints for the engine tests (tiny: created in well under a second each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.checkpoints import write_checkpoint


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama, untied embeddings, grouped-query attention (4 query heads, 2 KV heads)."""
    return write_checkpoint(tmp_path_factory.mktemp("llama"), arch="llama")


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2 (q/k/v biases), tied embeddings, sharded into several safetensors files."""
    return write_checkpoint(
        tmp_path_factory.mktemp("qwen2"), arch="qwen2", tied=True, shard_size="100KB", seed=1
    )


@pytest.fixture(params=["llama", "qwen2"])
def model_dir(request: pytest.FixtureRequest, llama_dir: Path, qwen2_dir: Path) -> Path:
    return llama_dir if request.param == "llama" else qwen2_dir

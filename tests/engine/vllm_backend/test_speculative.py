"""Speculative decoding on the vllm backend (vLLM's CPU kernels and our decode kernel): a
speculating sequence's k + 1 decode rows give transformers' greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from regional_node.engine import LLMEngine, SamplingParams
from tests.engine.checkpoints import random_prompts, write_checkpoint
from tests.engine.speculative_support import check_speculation_gives_transformers_tokens
from tests.engine.test_speculative import SPEC
from tests.engine.vllm_backend.conftest import needs_vllm
from tests.support.checkpoints import scale_attention_output

pytestmark = needs_vllm

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def local32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_checkpoint(tmp_path_factory.mktemp("local32"), arch="llama", head_dim=32)
    return scale_attention_output(path, 0.02)


@pytest.mark.slow
def test_speculating_on_vllm_kernels_gives_transformers_tokens(local32_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(local32_dir, attention_backend="vllm", speculative=SPEC)
    prompts = random_prompts([5, 20, 40, 3, 9, 12, 33])
    check_speculation_gives_transformers_tokens(engine, local32_dir, prompts, GREEDY)


@pytest.mark.slow
def test_a_draft_model_on_vllm_kernels_gives_transformers_tokens(local32_dir: Path, tmp_path: Path) -> None:
    """Both models on vLLM's kernels: the draft (the target's weights with attention damped
    further) drafts, the target verifies."""
    draft = scale_attention_output(write_checkpoint(tmp_path / "draft", arch="llama", head_dim=32), 0.01)
    spec = {"method": "draft", "draft_model": str(draft), "num_speculative_tokens": 3, "max_batch_size": 64}
    engine = LLMEngine.from_pretrained(
        local32_dir, attention_backend="vllm", speculative={**spec, "min_acceptance_rate": 0.0}
    )
    prompts = random_prompts([5, 20, 12], seed=2)
    check_speculation_gives_transformers_tokens(engine, local32_dir, prompts, GREEDY)

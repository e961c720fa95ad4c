"""Speculative decoding on the vllm backend (vLLM's CPU kernels and our decode kernel): a
speculating sequence's k + 1 decode rows give transformers' greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from regional_node.engine import LLMEngine, SamplingParams
from tests.engine.checkpoints import hf_greedy, random_prompts, write_checkpoint
from tests.engine.test_speculative import SPEC, _damp_attention
from tests.engine.vllm_backend.conftest import needs_vllm

pytestmark = needs_vllm

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def local32_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_checkpoint(tmp_path_factory.mktemp("local32"), arch="llama", head_dim=32)
    return _damp_attention(path, 0.02)


@pytest.mark.slow
def test_speculating_on_vllm_kernels_gives_transformers_tokens(local32_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(local32_dir, attention_backend="vllm", speculative=SPEC)
    prompts = random_prompts([5, 20, 40, 3, 9, 12, 33])
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert result.output_token_ids == hf_greedy(local32_dir, prompt, GREEDY.max_tokens)
    assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert engine.stats()["kv_blocks_used"] == 0


@pytest.mark.slow
def test_a_draft_model_on_vllm_kernels_gives_transformers_tokens(local32_dir: Path, tmp_path: Path) -> None:
    """Both models on vLLM's kernels: the draft (the target's weights with attention damped
    further) drafts, the target verifies."""
    draft = _damp_attention(write_checkpoint(tmp_path / "draft", arch="llama", head_dim=32), 0.01)
    spec = {"method": "draft", "draft_model": str(draft), "num_speculative_tokens": 3, "max_batch_size": 64}
    engine = LLMEngine.from_pretrained(
        local32_dir, attention_backend="vllm", speculative={**spec, "min_acceptance_rate": 0.0}
    )
    prompts = random_prompts([5, 20, 12], seed=2)
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert result.output_token_ids == hf_greedy(local32_dir, prompt, GREEDY.max_tokens)
    assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert engine.stats()["kv_blocks_used"] == 0
    assert engine.speculation is not None and engine.speculation.draft is not None
    assert engine.speculation.draft.blocks.num_used_blocks == 0

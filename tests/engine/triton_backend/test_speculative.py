"""Speculative decoding on the triton backend (kernels in Triton's interpreter): a speculating
sequence's k + 1 decode rows give transformers' greedy tokens, eagerly and through the padded
CUDA-graph buffers (run eagerly here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regional_node.engine import LLMEngine, SamplingParams
from tests.engine.checkpoints import random_prompts, write_checkpoint
from tests.engine.speculative_support import check_speculation_gives_transformers_tokens
from tests.engine.test_speculative import SPEC
from tests.engine.triton_backend.conftest import needs_triton
from tests.support.checkpoints import scale_attention_output

pytestmark = needs_triton

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def assert_some_proposals_rejected(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats["spec_decode_num_draft_tokens"] > stats["spec_decode_num_accepted_tokens"]


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scale_attention_output(write_checkpoint(tmp_path_factory.mktemp("local"), arch="llama"), 0.02)


@pytest.mark.slow
@pytest.mark.parametrize("graph_buffers", [False, True])
def test_speculating_on_triton_gives_transformers_tokens(local_dir: Path, graph_buffers: bool) -> None:
    engine = LLMEngine.from_pretrained(local_dir, attention_backend="triton", block_size=8, speculative=SPEC)
    if graph_buffers:
        engine.runner.use_decode_graphs(max_num_seqs=16, max_blocks_per_seq=64, capture=False)
    # Each step costs seconds in the interpreter: seed 290's prompts draft from their fourth token
    # on, so 12 tokens see proposals both accepted and rejected (32 tokens of seed 0 saw one token
    # accepted, in the last steps).
    prompts = random_prompts([5, 20, 40, 3, 9, 12, 33], seed=290)
    check_speculation_gives_transformers_tokens(engine, local_dir, prompts, GREEDY)
    assert_some_proposals_rejected(engine)


@pytest.mark.slow
def test_a_draft_model_on_triton_gives_transformers_tokens(local_dir: Path, tmp_path: Path) -> None:
    """The draft's catch-up chunks and decode rounds, and the target's verification, all on the
    triton backend (the draft: the target's weights with attention damped further)."""
    draft = scale_attention_output(write_checkpoint(tmp_path / "draft", arch="llama"), 0.01)
    spec = {"method": "draft", "draft_model": str(draft), "num_speculative_tokens": 3, "max_batch_size": 64}
    engine = LLMEngine.from_pretrained(
        local_dir, attention_backend="triton", block_size=8, speculative={**spec, "min_acceptance_rate": 0.0}
    )
    prompts = random_prompts([5, 20, 12], seed=2)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)  # 27 tokens drafted, 9 taken
    check_speculation_gives_transformers_tokens(engine, local_dir, prompts, params)
    assert_some_proposals_rejected(engine)

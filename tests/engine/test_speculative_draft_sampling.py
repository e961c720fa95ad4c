"""Draft-model speculative sampling keeps the target model's distribution exactly: the proposals
are drawn from another model's distribution q (a different random checkpoint on the same 8-token
vocabulary), accepted with min(1, p/q) and otherwise replaced from max(0, p - q); a chi-square test
of the joint distribution of the first three sampled tokens against transformers' probabilities of the
target. Fixed seeds: it cannot flake."""

from __future__ import annotations

from pathlib import Path

import pytest

from regional_node.engine import LLMEngine
from tests.engine.checkpoints import write_checkpoint
from tests.engine.test_speculative_sampling import (
    NUM_SAMPLES,
    VOCAB,
    check_first_three_tokens_follow_the_target,
    sample_prompt,
)


def _vocab8(tmp_path_factory: pytest.TempPathFactory, name: str, seed: int) -> Path:
    # The milder init of the n-gram test's model: flat enough that proposals are often rejected.
    return write_checkpoint(
        tmp_path_factory.mktemp(name),
        arch="llama",
        vocab_size=VOCAB,
        tokenizer=False,
        initializer_range=0.08,
        seed=seed,
    )


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _vocab8(tmp_path_factory, "target", 0)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _vocab8(tmp_path_factory, "draft", 7)


@pytest.mark.slow
def test_draft_speculative_sampling_keeps_the_target_distribution(target_dir: Path, draft_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(
        target_dir,
        max_num_seqs=128,
        speculative={
            "method": "draft",
            "draft_model": str(draft_dir),
            "num_speculative_tokens": 2,
            "max_batch_size": 128,
            "min_acceptance_rate": 0.0,
        },
    )
    # Four tokens: the first from the prefill, then one verification of two drafted tokens (the
    # second drafted after the first), so t2 and t3 come from positions 1 and 2 of a draft; the
    # joint of (t1, t2, t3) is tested (t4, a bonus or a next step's token, is left out).
    results = sample_prompt(engine, max_tokens=4)
    stats = engine.stats()
    # Every sequence verified two drafted tokens after its first one, and both outcomes were frequent.
    assert stats["spec_decode_num_drafts"] >= NUM_SAMPLES
    assert stats["spec_decode_num_draft_tokens"] >= 2 * NUM_SAMPLES
    assert stats["spec_decode_num_accepted_tokens_per_pos"][1] > NUM_SAMPLES // 10
    assert 0.1 < stats["spec_decode_acceptance_rate"] < 0.9

    check_first_three_tokens_follow_the_target(target_dir, results)
    assert engine.block_manager.num_used_blocks == 0
    assert engine.speculation is not None and engine.speculation.draft is not None
    assert engine.speculation.draft.blocks.num_used_blocks == 0

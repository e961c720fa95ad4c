"""Draft-model speculative sampling keeps the target model's distribution exactly: the proposals
are drawn from another model's distribution q (a different random checkpoint on the same 8-token
vocabulary), accepted with min(1, p/q) and otherwise replaced from max(0, p - q); a chi-square test
of the joint distribution of the first three sampled tokens against transformers' probabilities of the
target. Fixed seeds: it cannot flake."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from regional_node.engine import LLMEngine, SamplingParams
from tests.engine.checkpoints import write_checkpoint
from tests.engine.test_speculative_sampling import (
    NUM_SAMPLES,
    PROMPT,
    TEMPERATURE,
    TOP_K,
    VOCAB,
    chi_square_p_value,
    expected_joint,
    target_probs,
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
    params = [
        SamplingParams(max_tokens=4, temperature=TEMPERATURE, top_k=TOP_K, seed=seed, ignore_eos=True)
        for seed in range(NUM_SAMPLES)
    ]
    results = engine.generate([PROMPT] * NUM_SAMPLES, params)
    stats = engine.stats()
    # Every sequence verified two drafted tokens after its first one, and both outcomes were frequent.
    assert stats["spec_decode_num_drafts"] >= NUM_SAMPLES
    assert stats["spec_decode_num_draft_tokens"] >= 2 * NUM_SAMPLES
    assert stats["spec_decode_num_accepted_tokens_per_pos"][1] > NUM_SAMPLES // 10
    assert 0.1 < stats["spec_decode_acceptance_rate"] < 0.9

    observed = torch.zeros(VOCAB, VOCAB, VOCAB)
    for result in results:
        observed[tuple(result.output_token_ids[:3])] += 1
    expected = expected_joint(target_dir) * NUM_SAMPLES
    assert chi_square_p_value(observed, expected) > 1e-3

    # The reported logprobs are the target's, whether a token was an accepted proposal or not.
    p1 = target_probs(target_dir, [PROMPT])[0]
    for result in results[:20]:
        t1, t2, t3 = result.output_token_ids[:3]
        p2 = target_probs(target_dir, [[*PROMPT, t1]])[0]
        p3 = target_probs(target_dir, [[*PROMPT, t1, t2]])[0]
        want = [p1[t1].log(), p2[t2].log(), p3[t3].log()]
        assert result.logprobs[:3] == pytest.approx([float(x) for x in want], abs=1e-4)
    assert engine.block_manager.num_used_blocks == 0
    assert engine.speculation is not None and engine.speculation.draft is not None
    assert engine.speculation.draft.blocks.num_used_blocks == 0

"""Speculative sampling keeps the target model's distribution exactly: a chi-square test of the
joint distribution of three sampled tokens against transformers' probabilities, on an 8-token
vocabulary where prompt lookup proposes at every decode step. Fixed seeds: it cannot flake."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from regional_node.engine import LLMEngine, RequestOutput, SamplingParams
from tests.engine.checkpoints import hf_model, write_checkpoint

VOCAB = 8
# Every token occurs in the prompt, so with n-grams of one token there is always a proposal.
PROMPT = [3, 1, 4, 0, 5, 2, 6, 7, 2, 0, 3, 5]
TEMPERATURE, TOP_K = 0.8, 6
NUM_SAMPLES = 2000


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A milder init than the exactness tests' checkpoints: flatter distributions, so proposals are
    # accepted and rejected often and most (t1, t2, t3) cells are populated.
    return write_checkpoint(
        tmp_path_factory.mktemp("vocab8"),
        arch="llama",
        vocab_size=VOCAB,
        tokenizer=False,
        initializer_range=0.08,
    )


def target_probs(path: Path, contexts: list[list[int]]) -> torch.Tensor:
    """transformers' next-token distribution after each context, with the request's temperature
    and top-k applied (as the engine's sampler does)."""
    with torch.inference_mode():
        logits = hf_model(str(path))(torch.tensor(contexts)).logits[:, -1].double() / TEMPERATURE
    kth = logits.topk(TOP_K, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf")).softmax(dim=-1)


def expected_joint(path: Path) -> torch.Tensor:
    """P(t1, t2, t3) as a [VOCAB, VOCAB, VOCAB] table."""
    p1 = target_probs(path, [PROMPT])[0]
    p2 = target_probs(path, [[*PROMPT, a] for a in range(VOCAB)])
    p3 = target_probs(path, [[*PROMPT, a, b] for a in range(VOCAB) for b in range(VOCAB)])
    return p1[:, None, None] * p2[:, :, None] * p3.view(VOCAB, VOCAB, VOCAB)


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test; cells expecting fewer than 5 samples are pooled into one."""
    observed, expected = observed.flatten().double(), expected.flatten().double()
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def sample_prompt(engine: LLMEngine, max_tokens: int) -> list[RequestOutput]:
    """NUM_SAMPLES generations after PROMPT with the tests' temperature and top-k, seeds 0, 1, ..."""
    params = [
        SamplingParams(
            max_tokens=max_tokens, temperature=TEMPERATURE, top_k=TOP_K, seed=seed, ignore_eos=True
        )
        for seed in range(NUM_SAMPLES)
    ]
    return engine.generate([PROMPT] * NUM_SAMPLES, params)


def check_first_three_tokens_follow_the_target(path: Path, results: list[RequestOutput]) -> None:
    """The joint distribution of the results' first three tokens (t1, t2, t3) is the target's
    (a chi-square test against transformers'), and their reported logprobs are the target's, whether
    a token was an accepted proposal or not."""
    observed = torch.zeros(VOCAB, VOCAB, VOCAB)
    for result in results:
        observed[tuple(result.output_token_ids[:3])] += 1
    expected = expected_joint(path) * len(results)
    assert chi_square_p_value(observed, expected) > 1e-3

    p1 = target_probs(path, [PROMPT])[0]
    for result in results[:20]:
        t1, t2, t3 = result.output_token_ids[:3]
        p2 = target_probs(path, [[*PROMPT, t1]])[0]
        p3 = target_probs(path, [[*PROMPT, t1, t2]])[0]
        want = [p1[t1].log(), p2[t2].log(), p3[t3].log()]
        assert result.logprobs[:3] == pytest.approx([float(x) for x in want], abs=1e-4)


@pytest.mark.slow
def test_speculative_sampling_keeps_the_target_distribution(small_vocab_dir: Path) -> None:
    engine = LLMEngine.from_pretrained(
        small_vocab_dir,
        max_num_seqs=128,
        speculative={
            "num_speculative_tokens": 2,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 1,
            "max_batch_size": 128,
            "min_acceptance_rate": 0.0,
        },
    )
    results = sample_prompt(engine, max_tokens=3)
    stats = engine.stats()
    # Every sequence verified a proposal after its first token, and both outcomes were frequent.
    assert stats["spec_decode_num_drafts"] >= NUM_SAMPLES
    assert 0.05 < stats["spec_decode_acceptance_rate"] < 0.9

    assert all(len(result.output_token_ids) == 3 for result in results)
    check_first_three_tokens_follow_the_target(small_vocab_dir, results)

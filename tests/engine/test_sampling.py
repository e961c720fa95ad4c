"""Sampling: seeds reproduce whatever the batch, top-k/top-p/temperature behave, logprobs are right."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from regional_node.engine import InvalidRequestError, LLMEngine, SamplingParams
from regional_node.engine.sampler import argmax_rows, sample
from tests.engine.checkpoints import hf_greedy, hf_model, random_prompts


@pytest.fixture(scope="module")
def engine(llama_dir: Path) -> LLMEngine:
    return LLMEngine.from_pretrained(llama_dir, block_size=4)


def seeded(seed: int, **kw: float) -> SamplingParams:
    return SamplingParams(
        max_tokens=20, temperature=kw.pop("temperature", 1.0), seed=seed, ignore_eos=True, **kw
    )  # type: ignore[arg-type]


def test_seeded_sampling_is_the_same_alone_and_in_any_batch(llama_dir: Path) -> None:
    prompt = random_prompts([9], seed=10)[0]
    params = seeded(1234, top_p=0.9)
    alone = LLMEngine.from_pretrained(llama_dir).generate([prompt], params)[0].output_token_ids
    others = random_prompts([30, 3, 70], seed=11)
    mixed = [SamplingParams(max_tokens=25, temperature=0.0), seeded(7), seeded(99, top_k=5)]
    for kwargs in ({}, {"num_kv_blocks": 26, "block_size": 4}, {"max_num_batched_tokens": 5}):
        engine = LLMEngine.from_pretrained(llama_dir, **kwargs)
        results = engine.generate([*others, prompt], [*mixed, params])
        assert results[-1].output_token_ids == alone


def test_seed_survives_preemption(llama_dir: Path) -> None:
    prompts = random_prompts([20, 40, 9, 33], seed=12)
    params = [seeded(i) for i in range(4)]
    roomy = LLMEngine.from_pretrained(llama_dir).generate(prompts, params)
    tight_engine = LLMEngine.from_pretrained(llama_dir, num_kv_blocks=10, block_size=8)
    tight = tight_engine.generate(prompts, params)
    assert tight_engine.stats()["num_preemptions"] > 0
    assert [r.output_token_ids for r in tight] == [r.output_token_ids for r in roomy]


def test_different_seeds_differ(engine: LLMEngine) -> None:
    prompt = random_prompts([5], seed=13)[0]
    outs = {
        tuple(engine.generate([prompt], seeded(s, temperature=2.0))[0].output_token_ids) for s in range(4)
    }
    assert len(outs) > 1


@pytest.mark.parametrize("params", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 0.0}])
def test_degenerate_filters_equal_greedy(engine: LLMEngine, llama_dir: Path, params: dict) -> None:
    prompt = random_prompts([12], seed=14)[0]
    result = engine.generate([prompt], seeded(5, **params))[0]
    assert result.output_token_ids == hf_greedy(llama_dir, prompt, 20)


def reference_logprobs(llama_dir: Path, prompt: list[int], output: list[int]) -> torch.Tensor:
    """transformers' log-softmax over the vocabulary at every generated position."""
    model = hf_model(str(llama_dir))
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


def test_greedy_logprobs_are_log_softmax_of_raw_logits(engine: LLMEngine, llama_dir: Path) -> None:
    prompt = random_prompts([15], seed=15)[0]
    result = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))[0]
    ref = reference_logprobs(llama_dir, prompt, result.output_token_ids)
    expected = ref.gather(1, torch.tensor(result.output_token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)


def test_top_k_samples_only_from_the_top_k(engine: LLMEngine, llama_dir: Path) -> None:
    prompt = random_prompts([8], seed=16)[0]
    result = engine.generate([prompt], seeded(3, top_k=3, temperature=1.5))[0]
    ref = reference_logprobs(llama_dir, prompt, result.output_token_ids)
    top3 = ref.topk(3, dim=-1).indices
    for step, token in enumerate(result.output_token_ids):
        assert token in top3[step].tolist()
    # Logprobs are of the processed distribution: temperature applied, renormalised over the top 3.
    for step, (token, logprob) in enumerate(zip(result.output_token_ids, result.logprobs, strict=True)):
        scaled = ref[step] / 1.5
        expected = scaled[token] - torch.logsumexp(scaled[top3[step]], dim=0)
        assert logprob == pytest.approx(expected.item(), abs=1e-4)


def test_sampler_follows_the_distribution() -> None:
    logits = torch.tensor([[0.0, math.log(3.0), -math.inf, -math.inf]])
    generator = torch.Generator().manual_seed(0)
    draws = [sample(logits, [SamplingParams(temperature=1.0)], [generator])[0].token for _ in range(4000)]
    share = draws.count(1) / len(draws)
    assert set(draws) == {0, 1}
    assert abs(share - 0.75) < 0.03


def test_sampler_logprob_reflects_temperature() -> None:
    logits = torch.tensor([[2.0, 0.0]])
    [only] = sample(logits, [SamplingParams(temperature=2.0, top_k=1)], [torch.Generator()])
    assert only.token == 0 and only.logprob == pytest.approx(0.0)  # top-k 1 leaves a single token
    [drawn] = sample(logits, [SamplingParams(temperature=2.0)], [torch.Generator().manual_seed(1)])
    assert drawn.logprob in (
        pytest.approx(math.log(1 / (1 + math.exp(-1.0)))),
        pytest.approx(math.log(1 / (1 + math.exp(1.0)))),
    )


def test_logprobs_off_skips_them_and_changes_no_token(engine: LLMEngine) -> None:
    prompts = random_prompts([7, 30], seed=16)
    with_lp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    without = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=False)
    sampled = SamplingParams(max_tokens=6, temperature=0.8, seed=3, ignore_eos=True, logprobs=False)
    mixed = engine.generate(prompts + prompts, [with_lp, with_lp, without, sampled])
    assert mixed[2].output_token_ids == mixed[0].output_token_ids and mixed[2].logprobs == []
    assert len(mixed[0].logprobs) == 6 and mixed[3].logprobs == []
    alone = engine.generate(prompts[:1], without)[0]
    assert alone.output_token_ids == mixed[0].output_token_ids and alone.logprobs == []
    # A greedy step where no row wants them does not compute them at all.
    assert sample(torch.tensor([[0.0, 1.0]]), [without], [None]) == [(1, None, ())]
    with pytest.raises(InvalidRequestError, match="logprobs"):
        engine.add_request("bad", [3, 4], SamplingParams(logprobs="yes"))  # type: ignore[arg-type]


@pytest.mark.parametrize("vocab", [8192, 384, 128, 1000, 7])
def test_argmax_rows_is_argmax_with_ties_and_nan(vocab: int) -> None:
    """The two-level argmax picks what torch's argmax picks: the first of tied maxima, NaN first."""
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1, vocab // 3] = logits[1, vocab - 1] = 50.0  # a tie across slices: the first wins
    logits[2, 0] = logits[2, 1] = 60.0  # a tie inside one slice
    logits[3, vocab // 2] = float("nan")
    logits[4] = 0.0  # all tied
    for rows in (logits, logits[::2], torch.cat([logits, logits], dim=1)[:, :vocab]):  # strided too
        assert torch.equal(argmax_rows(rows), rows.argmax(dim=-1))


def test_max_tokens_and_length_finish(engine: LLMEngine) -> None:
    result = engine.generate([[3, 4, 5]], SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True))[0]
    assert len(result.output_token_ids) == 7 and len(result.logprobs) == 7
    assert result.finish_reason == "length"

"""Alternatives per token (SamplingParams.top_logprobs): each sampled token comes with the k most
likely tokens of the distribution it was drawn from, most likely first, as transformers computes
that distribution; tokens the request's top-k or top-p cut are not alternatives; asking for them
changes no token; speculative decoding reports the same ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from regional_node.engine import InvalidRequestError, LLMEngine, SamplingParams
from regional_node.engine.sampler import processed_logprobs, sample
from regional_node.engine.sampling_params import MAX_TOP_LOGPROBS
from tests.engine.checkpoints import hf_model, random_prompts, write_checkpoint
from tests.support.checkpoints import scale_attention_output


@pytest.fixture(scope="module")
def engine(llama_dir: Path) -> LLMEngine:
    return LLMEngine.from_pretrained(llama_dir, block_size=4)


def reference(llama_dir: Path, prompt: list[int], output: list[int], params: SamplingParams) -> torch.Tensor:
    """transformers' distribution at each generated position, through its own logits warpers in
    the sampler's order (temperature, top-k, top-p); greedy: the raw logits' log-softmax."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    with torch.inference_mode():
        logits = hf_model(str(llama_dir))(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    logits = logits.float()
    if not params.greedy:
        ids = torch.tensor([prompt])
        logits = TemperatureLogitsWarper(params.temperature)(ids, logits)
        if params.top_k:
            logits = TopKLogitsWarper(params.top_k)(ids, logits)
        if params.top_p < 1.0:
            logits = TopPLogitsWarper(params.top_p)(ids, logits)
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize(
    ("settings_", "expected_count"),
    [
        ({"temperature": 0.0}, 5),
        ({"temperature": 0.7, "top_k": 3, "seed": 11}, 3),  # the cut leaves 3 tokens to draw among
        ({"temperature": 1.3, "seed": 12}, 5),
    ],
)
def test_alternatives_are_the_top_of_transformers_distribution(
    engine: LLMEngine, llama_dir: Path, settings_: dict, expected_count: int
) -> None:
    params = SamplingParams(max_tokens=8, ignore_eos=True, top_logprobs=5, **settings_)
    prompt = random_prompts([13], seed=21)[0]
    result = engine.generate([prompt], params)[0]
    ref = reference(llama_dir, prompt, result.output_token_ids, params)
    assert len(result.top_logprobs) == len(result.output_token_ids) == 8
    for row, token, logprob, alternatives in zip(
        ref, result.output_token_ids, result.logprobs, result.top_logprobs, strict=True
    ):
        assert len(alternatives) == expected_count
        values, ids = row.topk(expected_count)
        assert [a[0] for a in alternatives] == ids.tolist()
        assert [a[1] for a in alternatives] == pytest.approx(values.tolist(), abs=1e-4)
        assert logprob == pytest.approx(row[token].item(), abs=1e-4)
        if params.greedy:
            assert alternatives[0][0] == token
        if params.top_k:  # every drawable token is listed, the sampled one included
            assert token in ids.tolist()


@settings(max_examples=60, deadline=None)
@given(
    vocab=st.integers(2, 300),
    rows=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.5, 1.0, 2.0]),  # temperature (0: greedy)
            st.integers(0, 6),  # top_k
            st.sampled_from([1.0, 0.9, 0.5, 1e-6]),  # top_p
            st.integers(0, MAX_TOP_LOGPROBS),  # top_logprobs
            st.integers(0, 2**32),  # seed
        ),
        min_size=1,
        max_size=5,
    ),
    logits_seed=st.integers(0, 2**16),
)
def test_sampler_alternatives_hold_for_any_batch(vocab: int, rows: list[tuple], logits_seed: int) -> None:
    """Per row: the alternatives are its processed distribution's most likely tokens, most likely
    first, as many as asked and the cut leaves; none for a row that did not ask; and the tokens
    are those the same batch samples without alternatives."""
    logits = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(logits_seed)) * 3
    logits[:, : vocab // 3] = logits[:, :1].clone()  # ties in the top, as a small model has them
    params = [
        SamplingParams(temperature=t, top_k=k, top_p=p, top_logprobs=n, seed=s) for t, k, p, n, s in rows
    ]
    plain = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=s) for t, k, p, _, s in rows]

    def generators() -> list[torch.Generator | None]:
        return [None if p.greedy else torch.Generator().manual_seed(p.seed) for p in params]

    emitted = sample(logits, params, generators())
    without = sample(logits, plain, generators())
    table = processed_logprobs(logits.float(), params)
    for p, token, alone, row in zip(params, emitted, without, table, strict=True):
        assert token.token == alone.token, "asking for alternatives changes no token"
        assert token.logprob == pytest.approx(row[token.token].item(), abs=1e-5)
        if not p.top_logprobs:
            assert token.top == ()
            continue
        drawable = int(torch.isfinite(row).sum())
        assert len(token.top) == min(p.top_logprobs, drawable)
        values = [value for _, value in token.top]
        assert values == sorted(values, reverse=True)
        assert values == pytest.approx(row.topk(len(values)).values.tolist(), abs=1e-6)
        assert all(row[i].item() == value for i, value in token.top)
        assert len({i for i, _ in token.top}) == len(token.top)
        # Nothing left out is more likely than what is listed.
        if len(token.top) < drawable:
            listed = torch.zeros(vocab, dtype=torch.bool)
            listed[[i for i, _ in token.top]] = True
            assert row[~listed].max().item() <= values[-1]


def test_speculative_decoding_reports_the_same_alternatives(tmp_path: Path) -> None:
    # Attention scaled down: the n-gram proposals get accepted and rejected (both paths run).
    model = scale_attention_output(write_checkpoint(tmp_path / "local", arch="llama"), 0.02)
    prompts = random_prompts([5, 20, 33], seed=4)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, top_logprobs=4)
    plain = LLMEngine.from_pretrained(model).generate(prompts, params)
    speculating = LLMEngine.from_pretrained(
        model, speculative={"num_speculative_tokens": 4, "max_batch_size": 64, "min_acceptance_rate": 0.0}
    )
    spec = speculating.generate(prompts, params)
    assert speculating.stats()["spec_decode_num_accepted_tokens"] > 0
    for a, b in zip(plain, spec, strict=True):
        assert a.output_token_ids == b.output_token_ids
        assert len(b.top_logprobs) == len(b.output_token_ids)
        for alt_a, alt_b in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert [i for i, _ in alt_a] == [i for i, _ in alt_b]
            assert [v for _, v in alt_a] == pytest.approx([v for _, v in alt_b], abs=1e-4)


def test_no_alternatives_unless_asked(engine: LLMEngine) -> None:
    prompt = random_prompts([6], seed=22)[0]
    result = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    assert len(result.logprobs) == 4 and result.top_logprobs == []


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_logprobs=MAX_TOP_LOGPROBS + 1),
        SamplingParams(top_logprobs=-1),
        SamplingParams(top_logprobs=True),  # type: ignore[arg-type]
        SamplingParams(top_logprobs=2, logprobs=False),
    ],
)
def test_bad_top_logprobs_is_refused_by_name(engine: LLMEngine, params: SamplingParams) -> None:
    with pytest.raises(InvalidRequestError, match="top_logprobs") as raised:
        engine.add_request("bad", [3, 4], params)
    assert raised.value.param == "top_logprobs"
    assert engine.stats()["num_waiting"] == 0

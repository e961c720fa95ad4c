"""Speculative decoding (ngram): greedy output is token-identical to decoding without it (and so to
transformers) under batching, preemption, prefix-cache hits, chunked prefill, stop strings,
max_tokens and stop tokens inside an accepted run; rejected proposals leave no KV behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import strategies as st

from regional_node.engine import EngineConfigError, LLMEngine, SamplingParams
from regional_node.engine.block_hash import extend_block_hashes
from tests.engine.checkpoints import hf_greedy, random_prompts, write_checkpoint
from tests.engine.speculative_support import check_tokens_under_random_aborts, random_schedules
from tests.support.checkpoints import scale_attention_output

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
# Speculate in every step of these small tests (the batch-size back-off is tested on its own).
SPEC = {"num_speculative_tokens": 4, "max_batch_size": 64, "min_acceptance_rate": 0.0}


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scale_attention_output(write_checkpoint(tmp_path_factory.mktemp("local"), arch="llama"), 0.02)


@pytest.fixture(scope="module")
def cyclic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scale_attention_output(write_checkpoint(tmp_path_factory.mktemp("cyclic"), arch="llama"), 0.0)


def spec_stats(engine: LLMEngine) -> tuple[int, int]:
    stats = engine.stats()
    return stats["spec_decode_num_draft_tokens"], stats["spec_decode_num_accepted_tokens"]


def assert_idle(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert sum(engine.block_manager.ref_counts) == 0


def test_greedy_tokens_equal_transformers_with_accepted_and_rejected_proposals(local_dir: Path) -> None:
    prompts = random_prompts([5, 20, 40, 3, 9, 12, 33])
    engine = LLMEngine.from_pretrained(local_dir, speculative=SPEC)
    results = engine.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_token_ids == hf_greedy(local_dir, prompt, GREEDY.max_tokens)
    drafted, accepted = spec_stats(engine)
    assert 0 < accepted < drafted  # both paths ran
    assert_idle(engine)


def test_qwen2_greedy_tokens_equal_transformers(qwen2_dir: Path) -> None:
    prompts = random_prompts([7, 30, 2], seed=3)
    engine = LLMEngine.from_pretrained(qwen2_dir, speculative={**SPEC, "prompt_lookup_min": 1})
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert result.output_token_ids == hf_greedy(qwen2_dir, prompt, GREEDY.max_tokens)
    assert spec_stats(engine)[0] > 0
    assert_idle(engine)


def test_preemption_under_speculation_keeps_tokens_and_leaks_nothing(local_dir: Path) -> None:
    prompts = random_prompts([20, 40, 9, 60, 30, 25], seed=1)
    engine = LLMEngine.from_pretrained(local_dir, num_kv_blocks=16, block_size=8, speculative=SPEC)
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert result.output_token_ids == hf_greedy(local_dir, prompt, GREEDY.max_tokens)
    assert engine.stats()["num_preemptions"] > 0 and spec_stats(engine)[1] > 0
    assert_idle(engine)


def test_prefix_cache_hits_and_chunked_prefill_beside_speculating_sequences(local_dir: Path) -> None:
    prompts = random_prompts([40, 70, 9], seed=2)
    engine = LLMEngine.from_pretrained(local_dir, max_num_batched_tokens=24, speculative=SPEC)
    first = engine.generate(prompts, GREEDY)
    # The same prompts again (cache hits), arriving beside new long prompts being chunked.
    again = prompts + random_prompts([90, 50], seed=4)
    second = engine.generate(again, GREEDY)
    assert engine.stats()["prefix_cache_hit_tokens"] > 0
    for prompt, result in zip(again, second, strict=True):
        assert result.output_token_ids == hf_greedy(local_dir, prompt, GREEDY.max_tokens)
    assert [r.output_token_ids for r in first] == [r.output_token_ids for r in second[:3]]
    assert_idle(engine)


def test_logprobs_are_the_target_models(local_dir: Path) -> None:
    prompts = random_prompts([5, 20, 40], seed=5)
    off = LLMEngine.from_pretrained(local_dir).generate(prompts, GREEDY)
    engine = LLMEngine.from_pretrained(local_dir, speculative=SPEC)
    on = engine.generate(prompts, GREEDY)
    assert spec_stats(engine)[1] > 0
    for a, b in zip(off, on, strict=True):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def _cycle(cyclic_dir: Path) -> tuple[list[int], list[int]]:
    """A prompt that already holds one lap of the model's greedy cycle (so prompt lookup predicts
    the output from the first decode on), and the output without speculation."""
    seed = random_prompts([6], seed=7)[0]
    lap = LLMEngine.from_pretrained(cyclic_dir).generate([seed], GREEDY)[0].output_token_ids
    prompt = seed + lap
    return prompt, LLMEngine.from_pretrained(cyclic_dir).generate([prompt], GREEDY)[0].output_token_ids


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 7, 13, 31])
def test_max_tokens_inside_an_accepted_run(cyclic_dir: Path, max_tokens: int) -> None:
    prompt, expected = _cycle(cyclic_dir)
    engine = LLMEngine.from_pretrained(cyclic_dir, speculative=SPEC)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    result = engine.generate([prompt], params)[0]
    assert result.output_token_ids == expected[:max_tokens] and result.finish_reason == "length"
    if max_tokens > 2:
        assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert_idle(engine)


@pytest.mark.parametrize("index", [2, 4, 5, 8])
def test_stop_token_inside_an_accepted_run(cyclic_dir: Path, index: int) -> None:
    prompt, expected = _cycle(cyclic_dir)
    stop = expected[index]
    first = expected.index(stop)
    params = SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[stop], ignore_eos=True)
    engine = LLMEngine.from_pretrained(cyclic_dir, speculative=SPEC)
    on = engine.generate([prompt], params)[0]
    assert on.output_token_ids == expected[: first + 1] and on.finish_reason == "stop"
    assert engine.stats()["spec_decode_num_accepted_tokens"] >= first - 1
    assert_idle(engine)


@pytest.mark.parametrize("index", [3, 6, 9])
def test_stop_string_inside_an_accepted_run(cyclic_dir: Path, index: int) -> None:
    prompt, _ = _cycle(cyclic_dir)
    off_engine = LLMEngine.from_pretrained(cyclic_dir)
    text = off_engine.generate([prompt], GREEDY)[0].text
    assert text, "the cycle decodes to text"
    stop = text[len(text) * index // 40 :][:2]
    params = SamplingParams(max_tokens=40, temperature=0.0, stop=[stop], ignore_eos=True)
    off = off_engine.generate([prompt], params)[0]
    engine = LLMEngine.from_pretrained(cyclic_dir, speculative=SPEC)
    on = engine.generate([prompt], params)[0]
    assert off.finish_reason == "stop"
    assert (on.output_token_ids, on.text, on.finish_reason) == (off.output_token_ids, off.text, "stop")
    assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert_idle(engine)


def _check_cache_holds_only_verified_tokens(engine: LLMEngine) -> None:
    """Every block a running sequence has published is the hash of its own (verified) tokens, and
    every block it holds is referenced."""
    bm = engine.block_manager
    for seq in engine.scheduler.running:
        hashes = extend_block_hashes(seq, bm.block_size)
        for i in range(seq.num_cached_blocks):
            assert (i + 1) * bm.block_size <= seq.num_tokens
            assert bm.block_hashes[seq.block_table[i]] in (hashes[i], None)
        assert all(bm.ref_counts[b] > 0 for b in seq.block_table)
        assert seq.num_computed_tokens <= seq.num_tokens


@pytest.fixture(scope="module")
def reference(local_dir: Path) -> LLMEngine:
    return LLMEngine.from_pretrained(local_dir)


@random_schedules
def test_any_batch_pool_and_aborts_give_the_same_tokens_and_leak_no_block(
    local_dir: Path, reference: LLMEngine, data: st.DataObject, num_prompts: int, num_kv_blocks: int, k: int
) -> None:
    """The invariant behind every test above, on random schedules: with speculation each request's
    tokens equal decoding without it, a cached block only ever holds verified tokens, and once every
    request has finished or been aborted (at a random step) no block is held."""
    engine = LLMEngine.from_pretrained(
        local_dir,
        num_kv_blocks=num_kv_blocks,
        block_size=4,
        max_num_batched_tokens=32,
        speculative={**SPEC, "num_speculative_tokens": k, "prompt_lookup_min": 1},
    )
    lengths = data.draw(st.lists(st.integers(1, 16), min_size=num_prompts, max_size=num_prompts))
    prompts = random_prompts(lengths, seed=data.draw(st.integers(0, 1000)))
    # Some prompts repeat themselves, so prompt lookup has something to propose from the start.
    prompts = [p + p[: data.draw(st.integers(0, len(p)))] for p in prompts]
    check_tokens_under_random_aborts(
        engine, reference, prompts, data, _check_cache_holds_only_verified_tokens
    )
    assert_idle(engine)


def test_ngram_proposes_what_followed_the_longest_recent_match() -> None:
    from regional_node.engine.speculative.ngram import propose_ngram

    tokens = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 6, 1, 2, 3]
    # "1 2 3" (n=3) occurred at the start, followed by 9 9 5; the longer match wins over "2 3" -> 7 8.
    assert propose_ngram(tokens, k=3, min_n=2, max_n=3) == [9, 9, 5]
    assert propose_ngram(tokens, k=3, min_n=2, max_n=2) == [7, 8, 6]
    assert propose_ngram([4, 5, 6], k=3, min_n=1, max_n=3) == []
    # In a cycle, the most recent occurrence with k tokens after it.
    assert propose_ngram([1, 2] * 5, k=4, min_n=2, max_n=2) == [1, 2, 1, 2]


def test_bad_speculative_options_are_refused_at_load(local_dir: Path) -> None:
    for bad, words in (
        ({"method": "draft"}, "needs speculative.draft_model"),
        ({"draft_model": "/models/x"}, "only used with method draft"),
        ({"prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"lookahead": 3}, "unknown speculative option"),
    ):
        with pytest.raises(EngineConfigError, match=words):
            LLMEngine.from_pretrained(local_dir, speculative=bad)


def test_a_request_can_opt_out(cyclic_dir: Path) -> None:
    prompt, expected = _cycle(cyclic_dir)
    engine = LLMEngine.from_pretrained(cyclic_dir, speculative=SPEC)
    out = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, speculative=False)
    assert engine.generate([prompt], out)[0].output_token_ids == expected[:20]
    assert engine.stats()["spec_decode_num_drafts"] == 0
    engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    assert engine.stats()["spec_decode_num_drafts"] > 0


def test_no_speculation_in_a_step_with_more_decodes_than_max_batch_size(cyclic_dir: Path) -> None:
    prompt, expected = _cycle(cyclic_dir)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    engine = LLMEngine.from_pretrained(cyclic_dir, speculative={**SPEC, "max_batch_size": 2})
    results = engine.generate([prompt] * 3, params)
    assert all(r.output_token_ids == expected[:20] for r in results)
    assert engine.stats()["spec_decode_num_drafts"] == 0
    engine.generate([prompt] * 2, params)
    assert engine.stats()["spec_decode_num_drafts"] > 0


def test_a_sequence_whose_proposals_keep_failing_stops_proposing(llama_dir: Path) -> None:
    """The plain random model: prompt lookup (n=1) finds matches everywhere and nearly all are
    rejected. With the back-off the sequence soon stops proposing; without it, it never does."""
    prompt = random_prompts([60], seed=9)[0]
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    counts = {}
    for rate in (0.0, 0.5):
        spec = {**SPEC, "prompt_lookup_min": 1, "min_acceptance_rate": rate}
        engine = LLMEngine.from_pretrained(llama_dir, speculative=spec)
        engine.generate([prompt], params)
        counts[rate] = engine.stats()["spec_decode_num_drafts"]
        assert engine.stats()["spec_decode_acceptance_rate"] < 0.5
    assert counts[0.0] > 20 and counts[0.5] < counts[0.0] / 2, counts

"""Speculative decoding with a draft model: greedy output is token-identical to transformers with a
draft that agrees only part of the time, under batching, preemption, aborts, prefix-cache hits and
chunked prefill; the draft's own KV pool is rolled back with each verification, holds only
verified tokens in its prefix cache, and is empty once every request has ended."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import strategies as st

from regional_node.engine import EngineConfigError, LLMEngine, SamplingParams
from regional_node.engine.block_hash import extend_block_hashes
from regional_node.engine.speculative.draft import DraftProposer
from regional_node.server import ConfigError
from regional_node.server.config import convert_config, validate_config
from tests.engine.checkpoints import hf_greedy, random_prompts, write_checkpoint
from tests.engine.speculative_support import check_tokens_under_random_aborts, random_schedules
from tests.support.checkpoints import make_checkpoint, scale_attention_output

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target: attention damped so its text depends mostly, not only, on the current token."""
    return scale_attention_output(write_checkpoint(tmp_path_factory.mktemp("target"), arch="llama"), 0.02)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The draft: the same weights with attention damped further (a weaker model of the target,
    still reading its context, so wrong draft KV shows in its proposals): it predicts the target's
    next token often but not always (about 44% of proposals accepted at k=3)."""
    return scale_attention_output(write_checkpoint(tmp_path_factory.mktemp("draft"), arch="llama"), 0.01)


def spec(draft_dir: Path, **more: object) -> dict[str, object]:
    # Speculate in every step (the back-off rules are tested on their own).
    return {
        "method": "draft",
        "draft_model": str(draft_dir),
        "num_speculative_tokens": 3,
        "max_batch_size": 64,
        "min_acceptance_rate": 0.0,
        **more,
    }


def draft_of(engine: LLMEngine) -> DraftProposer:
    assert engine.speculation is not None and engine.speculation.draft is not None
    return engine.speculation.draft


def assert_idle(engine: LLMEngine) -> None:
    """Nothing running, and no block held in either pool."""
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert sum(engine.block_manager.ref_counts) == 0
    draft = draft_of(engine)
    assert draft.blocks.num_used_blocks == 0 and sum(draft.blocks.ref_counts) == 0
    assert not draft._states


def expected_accepted(target: Path, draft: Path, prompt: list[int], max_tokens: int, k: int) -> int:
    """How many proposals greedy drafting gets accepted for one request when every proposal is
    made and verified (no trimming, no back-off), from transformers alone: at each verification
    the draft's greedy k-token continuation of the context against the target's. The engine
    reaches the same count only if its draft KV is exactly right after every roll-back."""
    want = hf_greedy(target, prompt, max_tokens)
    out, accepted = 1, 0  # the prefill samples the first token; speculation starts after it
    while out < max_tokens:
        n = min(k, max_tokens - out - 1)
        a = 0
        if n > 0:
            proposals = hf_greedy(draft, prompt + want[:out], n)
            while a < n and proposals[a] == want[out + a]:
                a += 1
        accepted += a
        out += a + 1
    return accepted


def test_greedy_tokens_equal_transformers_with_accepted_and_rejected_proposals(
    target_dir: Path, draft_dir: Path
) -> None:
    prompts = random_prompts([5, 20, 40, 3, 9])
    engine = LLMEngine.from_pretrained(target_dir, speculative=spec(draft_dir))
    results = engine.generate(prompts, GREEDY)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.output_token_ids == hf_greedy(target_dir, prompt, GREEDY.max_tokens)
    stats = engine.stats()
    # The draft proposed what transformers' greedy decoding of the draft model does.
    assert stats["spec_decode_num_accepted_tokens"] == sum(
        expected_accepted(target_dir, draft_dir, p, GREEDY.max_tokens, 3) for p in prompts
    )
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    # vLLM's counters, as for ngram: one entry per proposal position, non-increasing.
    per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
    assert len(per_pos) == 3 and per_pos[0] >= per_pos[1] >= per_pos[2] and per_pos[0] > 0
    assert_idle(engine)


def test_a_qwen2_target_with_a_llama_draft(qwen2_dir: Path, tmp_path: Path) -> None:
    """Any architecture can draft for any other with the same vocabulary; here the draft is a
    different random model, so nearly every proposal is rejected and the target decides alone."""
    draft = write_checkpoint(tmp_path / "draft", arch="llama", seed=5)
    prompts = random_prompts([7, 30, 2], seed=3)
    engine = LLMEngine.from_pretrained(qwen2_dir, speculative=spec(draft))
    for prompt, result in zip(prompts, engine.generate(prompts, GREEDY), strict=True):
        assert result.output_token_ids == hf_greedy(qwen2_dir, prompt, GREEDY.max_tokens)
    assert engine.stats()["spec_decode_num_draft_tokens"] > 0
    assert_idle(engine)


def test_preemption_frees_the_draft_blocks_and_keeps_the_tokens(target_dir: Path, draft_dir: Path) -> None:
    prompts = random_prompts([20, 40, 9, 60, 30, 25], seed=1)
    engine = LLMEngine.from_pretrained(
        target_dir, num_kv_blocks=16, block_size=8, speculative=spec(draft_dir)
    )
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
        tokens[str(i)] = []
    preempted_while_drafting = 0
    while engine.has_unfinished_requests():
        drafting = set(draft_of(engine)._states)
        before = engine.stats()["num_preemptions"]
        for delta in engine.step():
            tokens[delta.request_id] += delta.new_token_ids
        if engine.stats()["num_preemptions"] > before:
            waiting = {seq.request_id for seq in engine.scheduler.waiting}
            preempted_while_drafting += len(drafting & waiting)
        _check_draft_cache(engine)  # only running sequences hold draft blocks
    for i, prompt in enumerate(prompts):
        assert tokens[str(i)] == hf_greedy(target_dir, prompt, GREEDY.max_tokens)
    assert preempted_while_drafting > 0 and engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert_idle(engine)


def test_an_abort_mid_draft_frees_its_draft_blocks(target_dir: Path, draft_dir: Path) -> None:
    prompts = random_prompts([30, 12], seed=3)
    engine = LLMEngine.from_pretrained(target_dir, block_size=4, speculative=spec(draft_dir))
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    tokens: dict[str, list[int]] = {"0": [], "1": []}
    while engine.stats()["spec_decode_num_drafts"] < 4:
        for delta in engine.step():
            tokens[delta.request_id] += delta.new_token_ids
    held = draft_of(engine).blocks.num_used_blocks
    assert held > 0
    engine.abort_request("0")
    assert 0 < draft_of(engine).blocks.num_used_blocks < held
    while engine.has_unfinished_requests():
        for delta in engine.step():
            tokens[delta.request_id] += delta.new_token_ids
    assert tokens["1"] == hf_greedy(target_dir, prompts[1], GREEDY.max_tokens)
    assert tokens["0"] == hf_greedy(target_dir, prompts[0], GREEDY.max_tokens)[: len(tokens["0"])]
    assert_idle(engine)


def _accepted(engine: LLMEngine) -> int:
    return engine.stats()["spec_decode_num_accepted_tokens"]


def test_after_a_prefix_cache_hit_the_draft_proposes_as_from_scratch(
    target_dir: Path, draft_dir: Path
) -> None:
    """Greedy drafting is deterministic, so a draft whose KV is right proposes exactly what it
    proposes for the same prompt in a fresh engine: the accepted counts match. Checked after a
    target hit the draft cache lacks (the first request opted out of speculation: the draft
    prefills the prompt positions it has no KV for) and after a hit in both caches."""
    prompt = random_prompts([70], seed=6)[0]
    fresh = LLMEngine.from_pretrained(target_dir, speculative=spec(draft_dir))
    expected = fresh.generate([prompt], GREEDY)[0].output_token_ids
    assert expected == hf_greedy(target_dir, prompt, GREEDY.max_tokens)
    assert _accepted(fresh) == expected_accepted(target_dir, draft_dir, prompt, GREEDY.max_tokens, 3)

    engine = LLMEngine.from_pretrained(target_dir, speculative=spec(draft_dir))
    opted_out = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, speculative=False)
    assert engine.generate([prompt], opted_out)[0].output_token_ids == expected
    assert _accepted(engine) == 0 and draft_of(engine).blocks.num_cached_blocks == 0
    # Target hit, draft miss.
    result = engine.generate([prompt], GREEDY)[0]
    assert result.output_token_ids == expected and result.cached_tokens > 0
    assert _accepted(engine) == _accepted(fresh) > 0
    # Both caches hit.
    hits = engine.stats()["prefix_cache_hit_tokens"]
    assert draft_of(engine).blocks.num_cached_blocks > 0
    assert engine.generate([prompt], GREEDY)[0].output_token_ids == expected
    assert engine.stats()["prefix_cache_hit_tokens"] > hits
    assert _accepted(engine) == 2 * _accepted(fresh)
    assert_idle(engine)


def test_chunked_prefill_and_plain_decodes_beside_drafting_sequences(
    target_dir: Path, draft_dir: Path
) -> None:
    """Small steps (24 tokens): long prompts are prefilled in chunks while others draft; some
    requests opt out, so speculating and plain decodes share steps."""
    prompts = random_prompts([40, 70, 9, 90, 50], seed=2)
    engine = LLMEngine.from_pretrained(target_dir, max_num_batched_tokens=24, speculative=spec(draft_dir))
    params = [
        SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, speculative=i % 2 == 0)
        for i in range(len(prompts))
    ]
    for prompt, result in zip(prompts, engine.generate(prompts, params), strict=True):
        assert result.output_token_ids == hf_greedy(target_dir, prompt, GREEDY.max_tokens)
    assert _accepted(engine) > 0
    assert_idle(engine)


def _check_draft_cache(engine: LLMEngine) -> None:
    """The draft pool's invariants between steps: its tokens are a prefix of the target's, its KV
    never runs ahead of them, a block it published holds exactly the target's tokens, and every
    block it holds is referenced."""
    draft = draft_of(engine)
    running = {seq.request_id: seq for seq in engine.scheduler.running}
    bm = draft.blocks
    for request_id, state in draft._states.items():
        assert request_id in running, f"request {request_id} holds draft state but is not running"
        seq, target = state.seq, running[request_id]
        assert seq.token_ids == target.token_ids[: seq.num_tokens]
        assert seq.num_computed_tokens <= target.num_tokens
        hashes = extend_block_hashes(target, bm.block_size)
        for i in range(seq.num_cached_blocks):
            assert bm.block_hashes[seq.block_table[i]] in (hashes[i], None)
        assert all(bm.ref_counts[b] > 0 for b in seq.block_table)


@pytest.fixture(scope="module")
def reference(target_dir: Path) -> LLMEngine:
    return LLMEngine.from_pretrained(target_dir)


@random_schedules
def test_any_batch_pool_and_aborts_give_the_same_tokens_and_leak_no_draft_block(
    target_dir: Path,
    draft_dir: Path,
    reference: LLMEngine,
    data: st.DataObject,
    num_prompts: int,
    num_kv_blocks: int,
    k: int,
) -> None:
    """On random schedules (small pools: preemptions; small steps: chunked catch-up; aborts at
    random steps): each request's tokens equal decoding without speculation, the draft cache keeps
    its invariants after every step, and once every request has ended neither pool holds a block."""
    engine = LLMEngine.from_pretrained(
        target_dir,
        num_kv_blocks=num_kv_blocks,
        block_size=4,
        max_num_batched_tokens=32,
        speculative=spec(draft_dir, num_speculative_tokens=k),
    )
    lengths = data.draw(st.lists(st.integers(1, 40), min_size=num_prompts, max_size=num_prompts))
    prompts = random_prompts(lengths, seed=data.draw(st.integers(0, 1000)))
    check_tokens_under_random_aborts(engine, reference, prompts, data, _check_draft_cache)
    assert_idle(engine)


def test_no_drafting_in_a_step_with_more_decodes_than_max_batch_size(
    target_dir: Path, draft_dir: Path
) -> None:
    prompt = random_prompts([12], seed=8)[0]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    engine = LLMEngine.from_pretrained(target_dir, speculative=spec(draft_dir, max_batch_size=2))
    engine.generate([prompt] * 3, params)
    assert engine.stats()["spec_decode_num_drafts"] == 0
    assert draft_of(engine).blocks.num_cached_blocks == 0  # the draft model never ran
    engine.generate([prompt] * 2, params)
    assert engine.stats()["spec_decode_num_drafts"] > 0


def test_a_sequence_whose_drafts_keep_failing_stops_drafting(llama_dir: Path, tmp_path: Path) -> None:
    """A draft unrelated to the target: nearly every proposal is rejected, and with the back-off
    the sequence soon stops asking the draft model."""
    draft = write_checkpoint(tmp_path / "draft", arch="llama", seed=5)
    prompt = random_prompts([20], seed=9)[0]
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    counts = {}
    for rate in (0.0, 0.5):
        engine = LLMEngine.from_pretrained(llama_dir, speculative=spec(draft, min_acceptance_rate=rate))
        engine.generate([prompt], params)
        counts[rate] = engine.stats()["spec_decode_num_drafts"]
    assert counts[0.5] < counts[0.0] / 2, counts


def _retokenized(src: Path, out: Path) -> Path:
    """`src` with another tokenizer of the same size: two tokens' ids swapped."""
    shutil.copytree(src, out)
    raw = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = raw["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(raw), encoding="utf-8")
    return out


def test_a_draft_with_another_vocabulary_is_refused_at_load(
    target_dir: Path, draft_dir: Path, tmp_path: Path
) -> None:
    other_size = write_checkpoint(tmp_path / "v256", arch="llama", vocab_size=256)
    short = write_checkpoint(tmp_path / "short", arch="llama", max_positions=64)
    for draft, words in (
        (other_size, "vocab_size 256.*target's tokenizer"),
        (_retokenized(draft_dir, tmp_path / "retok"), "another tokenizer"),
        (tmp_path / "missing", "no such checkpoint folder"),
        (short, "max_position_embeddings 64"),
    ):
        with pytest.raises(EngineConfigError, match=words):
            LLMEngine.from_pretrained(target_dir, speculative=spec(draft))


def test_a_node_config_names_a_served_model_as_the_draft(target_dir: Path, draft_dir: Path) -> None:
    models = [
        {
            "name": "big",
            "path": str(target_dir),
            "engine": {"speculative": {"method": "draft", "draft_model": "tiny"}},
        },
        {"name": "tiny", "path": str(draft_dir)},
    ]
    config = validate_config(convert_config({"models": models}, source="node.yaml"), source="node.yaml")
    kwargs = config.models[0].engine.engine_kwargs()
    assert kwargs["speculative"]["draft_model"] == str(draft_dir)
    engine = LLMEngine.from_pretrained(config.models[0].path, **kwargs)
    assert engine.generate([[5, 6, 7]], GREEDY)[0].output_token_ids == hf_greedy(target_dir, [5, 6, 7], 40)

    for bad, words in (
        ({"method": "draft", "draft_model": "nowhere"}, "neither a model this node serves"),
        ({"method": "draft", "draft_model": "big"}, "cannot draft for itself"),
        ({"draft_model": "tiny"}, "only used with method draft"),
    ):
        models[0]["engine"] = {"speculative": bad}
        with pytest.raises(ConfigError, match=words):
            validate_config(convert_config({"models": models}, source="node.yaml"), source="node.yaml")
    models[0]["engine"] = {"speculative": {"method": "draft", "draft_model": "tiny"}}
    with pytest.raises(ConfigError, match="engine: meridian"):
        validate_config(convert_config({"engine": "vllm", "models": models}, source="n"), source="n")


def test_the_make_up_pair_drafts_small_for_large(tmp_path: Path) -> None:
    """`meridian up`'s checkpoints share a tokenizer (both written by regional_node.checkpoints
    from one corpus), so meridian-small (`tiny`) passes the vocabulary check as meridian-large's
    (`mini`) draft, and greedy tokens stay those of speculation off."""
    large = make_checkpoint(tmp_path, "llama", "mini")
    small = make_checkpoint(tmp_path, "llama", "tiny")
    prompt = random_prompts([12], seed=4)[0]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    off = LLMEngine.from_pretrained(large).generate([prompt], params)[0].output_token_ids
    engine = LLMEngine.from_pretrained(large, speculative={"method": "draft", "draft_model": str(small)})
    assert engine.generate([prompt], params)[0].output_token_ids == off
    assert engine.stats()["spec_decode_num_drafts"] > 0

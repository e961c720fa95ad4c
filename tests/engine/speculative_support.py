"""Checks shared by the speculative-decoding tests of the n-gram and draft proposers and of the
attention backends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from regional_node.engine import LLMEngine, SamplingParams
from tests.engine.checkpoints import hf_greedy


def random_schedules(test: Callable[..., None]) -> Any:
    """Mark a slow hypothesis test over random schedules: it takes `data` (for
    check_tokens_under_random_aborts), `num_prompts`, a KV pool of `num_kv_blocks` (small ones
    preempt) and `k` proposed tokens per step."""
    # No shrinking: each example loads an engine, and shrinking one took minutes.
    return pytest.mark.slow(
        settings(
            max_examples=8,
            deadline=None,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow],
        )(
            given(
                data=st.data(),
                num_prompts=st.integers(1, 5),
                num_kv_blocks=st.sampled_from([13, 24, 64]),
                k=st.integers(1, 5),
            )(test)
        )
    )


def check_tokens_under_random_aborts(
    engine: LLMEngine,
    reference: LLMEngine,
    prompts: list[list[int]],
    data: st.DataObject,
    check_step: Callable[[LLMEngine], None],
) -> None:
    """Run `prompts` greedily on the speculating `engine`, each with a drawn max_tokens and up to
    two of them aborted at drawn steps, calling `check_step(engine)` after every step: each
    request's tokens are a prefix of `reference`'s (decoding without speculation), all of them for
    a request that was not aborted."""
    num_prompts = len(prompts)
    max_tokens = data.draw(st.lists(st.integers(1, 14), min_size=num_prompts, max_size=num_prompts))
    abort_at = data.draw(st.dictionaries(st.integers(0, num_prompts - 1), st.integers(0, 12), max_size=2))
    tokens: dict[str, list[int]] = {}
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        tokens[str(i)] = []
    step = 0
    while engine.has_unfinished_requests():
        for i, at in abort_at.items():
            if at == step:
                engine.abort_request(str(i))
        for delta in engine.step():
            tokens[delta.request_id] += delta.new_token_ids
        check_step(engine)
        step += 1
    expected = reference.generate(
        prompts, [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens]
    )
    for i, want in enumerate(expected):
        got = tokens[str(i)]
        assert got == want.output_token_ids[: len(got)]
        if i not in abort_at:
            assert got == want.output_token_ids


def check_speculation_gives_transformers_tokens(
    engine: LLMEngine, checkpoint: Path, prompts: list[list[int]], params: SamplingParams
) -> None:
    """`engine` (speculating on `checkpoint`) gives transformers' greedy tokens for `prompts`, some
    proposals were accepted, and afterwards no KV block is held, in the draft's pool either."""
    for prompt, result in zip(prompts, engine.generate(prompts, params), strict=True):
        assert result.output_token_ids == hf_greedy(checkpoint, prompt, params.max_tokens)
    assert engine.stats()["spec_decode_num_accepted_tokens"] > 0
    assert engine.stats()["kv_blocks_used"] == 0
    assert engine.speculation is not None
    if engine.speculation.draft is not None:
        assert engine.speculation.draft.blocks.num_used_blocks == 0

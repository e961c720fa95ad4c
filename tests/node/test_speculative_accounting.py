"""The per-request speculation the node reports (`SpecTally`, summed from the engine's deltas) as an
invariant over random batches: each request's numbers add up to its tokens, the requests' numbers
add up to the engine's vllm:spec_decode_* totals, an opted-out request verifies nothing, and every
request's tokens are those of decoding without speculation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from regional_node.engine import LLMEngine, SamplingParams
from regional_node.server.generation import SpecTally
from tests.support.checkpoints import make_checkpoint, scale_attention_output

TOTALS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")


@pytest.fixture(scope="module")
def damped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with attention output scaled down: greedy text partly cycles, so prompt
    lookup's proposals are partly accepted and partly rejected."""
    path = make_checkpoint(tmp_path_factory.mktemp("damped"), "llama", "tiny")
    return scale_attention_output(path, 0.02)


@pytest.fixture(scope="module")
def engines(damped: Path) -> tuple[LLMEngine, LLMEngine]:
    spec = {
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "max_batch_size": 64,
        "min_acceptance_rate": 0.0,
    }
    return LLMEngine.from_pretrained(damped, speculative=spec), LLMEngine.from_pretrained(damped)


prompt_st = st.lists(st.integers(3, 2000), min_size=1, max_size=10).map(lambda p: p * 3)
request_st = st.tuples(prompt_st, st.integers(1, 24), st.booleans())
# Prompt lookup surely proposes here (a repeated prompt, n = 1), accepted or not.
REPEATS = [(list(range(3, 13)) * 3, 24, True), (list(range(3, 13)) * 3, 24, False)]


@pytest.mark.slow
@example(requests=REPEATS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request_st, min_size=1, max_size=4))
def test_each_requests_speculation_adds_up_to_its_tokens_and_to_the_engines_totals(
    engines: tuple[LLMEngine, LLMEngine], requests: list[tuple[list[int], int, bool]]
) -> None:
    engine, plain = engines
    before = {key: engine.stats()[key] for key in TOTALS}
    tallies: dict[str, SpecTally] = {}
    tokens: dict[str, list[int]] = {}
    for i, (prompt, max_tokens, speculative) in enumerate(requests):
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative=speculative
        )
        engine.add_request(str(i), prompt, params)
        tallies[str(i)], tokens[str(i)] = SpecTally(), []
    while engine.has_unfinished_requests():
        for delta in engine.step():
            # As the node's Generation does: decode steps are those after the first token's.
            tallies[delta.request_id].add(delta, decoding=bool(tokens[delta.request_id]))
            tokens[delta.request_id] += delta.new_token_ids

    expected = plain.generate(
        [p for p, _, _ in requests],
        [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n, _ in requests],
    )
    for i, ((_, max_tokens, speculative), want) in enumerate(zip(requests, expected, strict=True)):
        tally, got = tallies[str(i)], tokens[str(i)]
        assert got == want.output_token_ids
        # Nothing ends a request inside an accepted run here (ignore_eos, no stop strings; the
        # engine never proposes past max_tokens): one token per decode step plus those accepted.
        assert len(got) == max_tokens == 1 + tally.steps + tally.accepted_tokens
        assert sum(tally.accepted_counts) == tally.drafts <= tally.steps
        assert sum(j * n for j, n in enumerate(tally.accepted_counts)) == tally.accepted_tokens
        assert tally.accepted_tokens <= tally.draft_tokens
        if not speculative:
            assert tally.drafts == 0
    after = engine.stats()
    summed = {
        "spec_decode_num_drafts": sum(t.drafts for t in tallies.values()),
        "spec_decode_num_draft_tokens": sum(t.draft_tokens for t in tallies.values()),
        "spec_decode_num_accepted_tokens": sum(t.accepted_tokens for t in tallies.values()),
    }
    assert {key: after[key] - before[key] for key in TOTALS} == summed

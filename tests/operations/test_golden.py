"""The golden file's comparison rule (regional_node/probes/golden.py): token ids exactly, each
chosen token's logprob within the dtype's tolerance, the prompt's ids as certified."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from regional_node.probes.golden import GoldenSet, ProbeCase, ProbeOutput, compare, read_golden, write_golden

CASE = ProbeCase(prompt="hi", prompt_token_ids=[5, 6], token_ids=[1, 2, 3], logprobs=[-0.5, -1.0, -2.0])
GOLDEN = GoldenSet(checkpoint="abc", dtype="float32", logprob_tolerance=1e-3, cases=[CASE])


def test_the_certified_answer_passes_and_the_file_round_trips(tmp_path) -> None:
    assert compare(GOLDEN, [ProbeOutput([5, 6], [1, 2, 3], [-0.5, -1.0, -2.0])]).passed
    write_golden(tmp_path / "g.json", GOLDEN)
    assert read_golden(tmp_path / "g.json") == GOLDEN


def test_a_changed_token_a_drifted_logprob_or_another_tokenizer_fails() -> None:
    token = compare(GOLDEN, [ProbeOutput([5, 6], [1, 9, 3], [-0.5, -1.0, -2.0])])
    assert not token.passed and "token 1 is 9, certified 2" in token.detail
    drift = compare(GOLDEN, [ProbeOutput([5, 6], [1, 2, 3], [-0.5, -1.01, -2.0])])
    assert not drift.passed and "logprob" in drift.detail
    tokenizer = compare(GOLDEN, [ProbeOutput([5, 7], [1, 2, 3], [-0.5, -1.0, -2.0])])
    assert not tokenizer.passed and "tokenizer" in tokenizer.detail
    assert not compare(GOLDEN, [ProbeOutput([5, 6], [1, 2], [-0.5, -1.0])]).passed


@given(
    st.lists(st.integers(0, 3), min_size=3, max_size=3),
    st.lists(st.floats(-5e-3, 5e-3), min_size=3, max_size=3),
)
def test_passes_exactly_when_ids_match_and_logprobs_are_within_tolerance(
    ids: list[int], shifts: list[float]
) -> None:
    logprobs = [lp + shift for lp, shift in zip(CASE.logprobs, shifts, strict=True)]
    verdict = compare(GOLDEN, [ProbeOutput([5, 6], ids, logprobs)])
    expected = ids == CASE.token_ids and all(
        abs(a - b) <= 1e-3 for a, b in zip(logprobs, CASE.logprobs, strict=True)
    )
    assert verdict.passed == expected

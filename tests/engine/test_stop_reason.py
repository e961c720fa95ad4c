"""vLLM's `stop_reason`: the stop string or stop token id that ended a request, None when something
else did (EOS, the length limit).

Generation stops at the token whose text completes a stop string, so the stop string reported is
the earliest-starting one (at the same start, the first listed) in the text released up to that
token, and the client gets exactly the text before it. Requests here run through the real request
intake, output processor and detokenizer over a scripted tokenizer: each token is a short piece of
text, and two tokens are the halves of one character (the first alone decodes to U+FFFD, so the
detokenizer holds it back, as it does half a UTF-8 character).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from regional_node.engine import RequestDelta, SamplingParams
from regional_node.engine.detokenizer import IncrementalDetokenizer
from regional_node.engine.output_processor import RequestState, append_token, append_tokens
from regional_node.engine.outputs import Finish
from regional_node.engine.request_intake import RequestIntake
from regional_node.engine.sampler import SampledToken
from regional_node.engine.stop_strings import StopStringMatcher

HALF_1, HALF_2 = "\x01", "\x02"  # the two halves of "é"
PIECES = ["a", "b", "c", "ab", "ba", "bca", " ", HALF_1, HALF_2, "#", "%"]
EOS, STOP_TOKEN = PIECES.index("#"), PIECES.index("%")
TEXT_TOKENS = [i for i in range(len(PIECES)) if i not in (EOS, STOP_TOKEN)]
PROMPT = [0, 1]
NEVER_MATCHING = ["☃", "a☃"]


class ScriptedTokenizer:
    """Decodes like a byte-level tokenizer with errors="replace": a lone half is U+FFFD."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = "".join(PIECES[i] for i in ids).replace(HALF_1 + HALF_2, "é")
        return text.replace(HALF_1, "\ufffd").replace(HALF_2, "\ufffd")


TOKENIZER = ScriptedTokenizer()


def intake() -> RequestIntake:
    return RequestIntake(
        vocab_size=len(PIECES),
        max_model_len=1000,
        tokenizer=TOKENIZER,  # type: ignore[arg-type]
        eos_token_ids=(EOS,),
        device=torch.device("cpu"),
    )


def build(params: SamplingParams, carried: list[int] | None = None) -> tuple[RequestState, Finish | None]:
    return intake().build(
        "r",
        list(PROMPT),
        params,
        tenant="t",
        priority="interactive",
        cache_salt=None,
        continuation_token_ids=carried,
        arrival=0,
    )


@dataclass
class Outcome:
    text: str
    token_ids: list[int]
    finish: Finish


def expected(tokens: list[int], params: SamplingParams) -> Outcome:
    """What the request must end with, found without the output processor: the text each token
    releases (the detokenizer's push, and its flush at the end), then the first point at which the
    released text holds a stop string."""
    detok = IncrementalDetokenizer(TOKENIZER, PROMPT)  # type: ignore[arg-type]
    eos: set[int] = set() if params.ignore_eos else {EOS}
    releases: list[tuple[int, str]] = []  # (tokens generated, text released then), in order
    end: Finish | None = None
    for n, token in enumerate(tokens, 1):
        if token in eos or token in params.stop_token_ids:
            releases.append((n, detok.flush()))
            end = Finish("stop", None if token in eos else token)
            break
        releases.append((n, detok.push(token)))
        if n == params.max_tokens:
            releases.append((n, detok.flush()))
            end = Finish("length")
            break
    text = ""
    for n, released in releases:
        text += released
        hits = [(text.find(stop), i) for i, stop in enumerate(params.stop) if stop in text]
        if hits:
            at, first = min(hits)
            return Outcome(text[:at], tokens[:n], Finish("stop", params.stop[first]))
    assert end is not None, "the script ends the request"
    return Outcome(text, tokens[: releases[-1][0]], end)


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[int], SamplingParams]:
    """A script of tokens (EOS and the stop token among them), and params whose stop strings are
    substrings of the script's text (overlapping and repeated ones too) and strings that never
    match."""
    tokens = draw(st.lists(st.sampled_from(range(len(PIECES))), min_size=1, max_size=14))
    text = TOKENIZER.decode(tokens)
    substrings = st.integers(0, len(text) - 1).flatmap(
        lambda i: st.integers(i + 1, min(len(text), i + 4)).map(lambda j: text[i:j])
    )
    stops = draw(st.lists(st.one_of(substrings, st.sampled_from(NEVER_MATCHING)), max_size=4))
    params = SamplingParams(
        max_tokens=draw(st.integers(1, len(tokens))),
        temperature=0.0,
        stop=stops,
        stop_token_ids=draw(st.lists(st.sampled_from([STOP_TOKEN, EOS]), max_size=2, unique=True)),
        ignore_eos=draw(st.booleans()),
    )
    return tokens, params


def generate(params: SamplingParams, tokens: list[int], runs: list[int]) -> list[RequestDelta]:
    """Feed the tokens until the request ends, `runs[i]` tokens per step (a speculative step's
    accepted run), cycling; the deltas."""
    state, finish = build(params)
    assert finish is None
    deltas: list[RequestDelta] = []
    at = 0
    while not (deltas and deltas[-1].finished):
        size = runs[len(deltas) % len(runs)]
        deltas.append(append_tokens(state, [SampledToken(t, None) for t in tokens[at : at + size]]))
        at += size
    return deltas


def outcome(deltas: list[RequestDelta]) -> Outcome:
    last = deltas[-1]
    assert last.finished and last.finish_reason is not None
    return Outcome(
        "".join(d.new_text for d in deltas),
        [t for d in deltas for t in d.new_token_ids],
        Finish(last.finish_reason, last.stop_reason),
    )


@settings(max_examples=300, deadline=None)
@given(
    requests(),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
)
def test_stop_reason_is_the_earliest_stop_string_or_the_stop_token(
    request: tuple[list[int], SamplingParams], runs: list[int]
) -> None:
    tokens, params = request
    want = expected(tokens, params)
    assert outcome(generate(params, tokens, [1])) == want
    assert outcome(generate(params, tokens, runs)) == want, "speculative runs end it the same way"
    if want.finish.stop_reason is None:
        assert want.finish.reason == "length" or want.token_ids[-1] == EOS


@settings(max_examples=150, deadline=None)
@given(requests(), st.data())
def test_a_continuation_reports_the_stop_reason_of_the_unbroken_stream(
    request: tuple[list[int], SamplingParams], data: st.DataObject
) -> None:
    tokens, params = request
    whole = generate(params, tokens, [1])
    want = outcome(whole)
    k = data.draw(st.integers(1, len(whole)), label="chunks the client had")
    carried = [t for d in whole[:k] for t in d.new_token_ids]
    state, finish = build(replace(params, max_tokens=params.max_tokens - k), carried)
    rest: list[RequestDelta] = []
    if finish is not None:
        rest.append(state.delta([], "", [], finish))
    else:
        for token in tokens[k:]:
            rest.append(append_token(state, SampledToken(token, None)))
            if rest[-1].finished:
                break
    assert rest and rest[-1].finished, "the continuation ends"
    assert outcome(whole[:k] + rest) == want


def test_stop_string_is_reported_and_cut() -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0, stop=["☃", "ca", "bc"])
    tokens = [PIECES.index("ab"), PIECES.index("bca"), PIECES.index("a")]
    want = Outcome("ab", tokens[:2], Finish("stop", "bc"))
    assert outcome(generate(params, tokens, [1])) == expected(tokens, params) == want


def test_stop_token_id_is_reported_as_the_int() -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[STOP_TOKEN])
    tokens = [PIECES.index("ab"), STOP_TOKEN]
    assert outcome(generate(params, tokens, [1])) == Outcome("ab", tokens, Finish("stop", STOP_TOKEN))


def test_eos_has_no_stop_reason_even_when_listed_in_stop_token_ids() -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[EOS])
    tokens = [PIECES.index("ab"), EOS]
    assert outcome(generate(params, tokens, [1])) == Outcome("ab", tokens, Finish("stop", None))


def test_eos_listed_with_ignore_eos_is_a_stop_token() -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[EOS], ignore_eos=True)
    tokens = [PIECES.index("ab"), EOS]
    assert outcome(generate(params, tokens, [1])) == Outcome("ab", tokens, Finish("stop", EOS))


def test_length_has_no_stop_reason() -> None:
    params = SamplingParams(max_tokens=2, temperature=0.0, stop=NEVER_MATCHING)
    tokens = [PIECES.index("ab"), PIECES.index("c"), PIECES.index("a")]
    assert outcome(generate(params, tokens, [1])) == Outcome("abc", tokens[:2], Finish("length"))


def test_held_back_text_released_at_the_end_can_hold_the_stop_string() -> None:
    """Half a character held back until the length limit comes out as U+FFFD: a stop string it
    completes is what ended the request, as vLLM's stop strings override the length."""
    params = SamplingParams(max_tokens=2, temperature=0.0, stop=["b\ufffd"])
    tokens = [PIECES.index("ab"), PIECES.index(HALF_1)]
    assert outcome(generate(params, tokens, [1])) == Outcome("a", tokens, Finish("stop", "b\ufffd"))


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="abc", max_size=12),
    st.lists(st.text(alphabet="abc", min_size=1, max_size=3), min_size=1, max_size=4),
)
def test_matcher_fed_the_whole_text_reports_the_earliest_starting_stop_string(
    text: str, stops: list[str]
) -> None:
    matcher = StopStringMatcher(stops)
    emitted, matched = matcher.feed(text)
    hits = [(text.find(stop), i) for i, stop in enumerate(stops) if stop in text]
    if hits:
        at, first = min(hits)
        assert (emitted, matched) == (text[:at], stops[first])
    else:
        assert matched is None and emitted + matcher.flush() == text

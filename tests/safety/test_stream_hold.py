"""Holding back streamed text: nothing that matches a rule is released, however it is split."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.safety.policy import BlocklistRule, SafetyPolicy
from gateway.safety.rules import BY_NAME, BlocklistEntry, compile_words
from gateway.safety.stream import StreamHold

SECRET = "sk-proj-Abcdefghijklmnopqrstuvwx123"
CARD = "4111 1111 1111 1111"
TEXT = f"Here is the key {SECRET} and the card {CARD}, and some more words after them to end."
REDACTED = "Here is the key [REDACTED:openai_key] and the card [REDACTED:credit_card], and some more words after them to end."
KEY_PEM = "-----BEGIN PRIVATE KEY-----\n" + "QUJD" * 200 + "\n-----END PRIVATE KEY-----"


def hold(words: tuple[str, ...] = ("falcon",), **rules: str) -> StreamHold:
    policy = SafetyPolicy(
        rules=rules,
        blocklist=(BlocklistRule(BlocklistEntry("blocklist[0]", compile_words(words)), "block"),),
        hold_back_chars=96,
    )
    return StreamHold(policy, tuple(rules), policy.blocklist_entries())


def run(h: StreamHold, pieces: list[str]) -> tuple[str, bool]:
    out, blocked = [], False
    for i, piece in enumerate(pieces):
        release = h.feed(piece, final=i == len(pieces) - 1)
        out.append(release.text)
        if release.blocked:
            blocked = True
            break
    return "".join(out), blocked


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def test_a_secret_split_over_two_chunks_is_redacted() -> None:
    at = TEXT.index(SECRET) + 10
    text, blocked = run(hold(openai_key="redact", credit_card="redact"), [TEXT[:at], TEXT[at:]])
    assert text == REDACTED and not blocked


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(TEXT)), max_size=30))
def test_redaction_is_the_same_however_the_text_is_split(cuts: list[int]) -> None:
    text, _ = run(hold(openai_key="redact", credit_card="redact"), split(TEXT, cuts))
    assert text == REDACTED


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_a_blocked_word_is_never_released_however_it_is_split(cuts: list[int]) -> None:
    source = "a" * 150 + " the falcon flies " + "b " * 100
    text, blocked = run(hold(), split(source, cuts))
    assert blocked and "falcon" not in text and "fal" not in text[-100:]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=400), max_size=30),
    st.text([" ", "\n", "\t", "-", "_", "\u00a0"], min_size=1, max_size=4),
)
def test_a_blocked_phrase_is_never_released_however_its_words_are_apart_or_split(
    cuts: list[int], apart: str
) -> None:
    source = "a" * 150 + f" the project{apart}falcon flies " + "b " * 100
    text, blocked = run(hold(("project falcon",)), split(source, cuts))
    assert blocked and "project" not in text


def test_a_private_key_longer_than_the_window_is_held_until_it_ends() -> None:
    pieces = ["intro " * 30] + [KEY_PEM[i : i + 7] for i in range(0, len(KEY_PEM), 7)] + [" outro " * 30]
    h = hold(private_key="redact")
    released = "".join(h.feed(p).text for p in pieces) + h.feed("", final=True).text
    assert "QUJD" not in released and "BEGIN" not in released
    assert "[REDACTED:private_key]" in released


def test_text_is_released_once_past_the_window_and_all_of_it_at_the_end() -> None:
    h = hold(email="redact")
    assert h.feed("x" * 100).text == "x" * 4
    assert h.feed("y" * 10).text == "x" * 10
    assert h.feed("", final=True).text == "x" * 86 + "y" * 10


def test_every_detector_is_known_to_the_hold() -> None:
    h = hold(**dict.fromkeys(BY_NAME, "redact"))
    assert run(h, [TEXT])[0] == REDACTED

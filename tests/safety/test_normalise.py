# ruff: noqa: RUF001, RUF003 -- look-alike characters are this file's subject
"""The normalised view the rules match on: what it folds, what it leaves alone, and that every
position in it maps back to the original characters it was made from."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.safety.normalise import _normalise_clusters, normalise
from gateway.safety.rules import BY_NAME, BlocklistEntry, compile_words, scan

# Characters the view changes, and the plain ones around them, in any mix.
SAMPLES = (
    "aZ09 -.@+_\n"  # ASCII
    "０９ＡＺａｚ＠\u00a0\u2009\u202f\u3000"  # full-width, spaces
    "\u0660\u0669\u06f4\u0966\u09ea"  # Arabic-Indic, Eastern, Devanagari, Bengali digits
    "аеорсхАВЕКМНОРСТХІіΑΒΕΙΚΟΡΤοναι"  # Cyrillic and Greek look-alikes
    "бжшЯλπΩ謝謝"  # letters with no look-alike
    "\u200b\u200c\u200d\u2060\u00ad\ufeff\u200e\ufe0f"  # invisible
    "\u0301\u0308\u0327\u094d"  # combining marks
    "\ufb01\u01c5\u2162\u2460\u2013\u2212\U0001d7ce\U0001d41a"  # ligature, Ⅲ, ①, dashes, maths
)
TEXTS = st.text(st.sampled_from(SAMPLES), max_size=60) | st.text(max_size=40)


def test_what_is_folded() -> None:
    assert normalise("４１１１\u00a0١١١١\u2009۱۱۱۱\u200b 1111").text == "4111 1111 1111 1111"
    assert normalise("Ѕесrеt ΡrојесtΙ").text == "Secret ProjectI"
    assert normalise("ﬁ\u00ad\u200dne\u2013tuned").text == "fine-tuned"
    assert normalise("cafe\u0301").text == normalise("café").text == "café"


def test_what_is_left_alone() -> None:
    # ASCII (no leetspeak), letters that look like digits (Cyrillic З, б), letters with no
    # look-alike, accented letters, an em dash (not a hyphen).
    for text in ("I1l0O|", "З6б", "шлюз λΩ", "会议", "naïve", "x\u2014y"):
        assert normalise(text).text == text, text


def test_an_ascii_text_is_its_own_view() -> None:
    view = normalise("plain ascii")
    assert view.text == "plain ascii" and view.span(2, 5) == (2, 5)


@settings(max_examples=150, deadline=None)
@given(TEXTS, st.data())
def test_every_view_span_maps_to_original_characters_that_read_as_it(text: str, data: st.DataObject) -> None:
    view = normalise(text)
    if not view.text:
        return
    a = data.draw(st.integers(0, len(view.text) - 1))
    b = data.draw(st.integers(a + 1, len(view.text)))
    start, end = view.span(a, b)
    assert 0 <= start < end <= len(text)
    assert view.text[a:b] in normalise(text[start:end]).text
    assert view.position(a) == start and view.position(len(view.text)) == len(text)


@settings(max_examples=200, deadline=None)
@given(st.text(st.sampled_from(SAMPLES.replace("\u0301\u0308\u0327\u094d", "")), max_size=60))
def test_the_one_pass_view_and_the_cluster_view_agree(text: str) -> None:
    fast, slow = normalise(text), _normalise_clusters(text)
    assert fast.text == slow.text
    assert [fast.span(i, i + 1) for i in range(len(fast.text))] == [
        slow.span(i, i + 1) for i in range(len(slow.text))
    ]


@settings(max_examples=200, deadline=None)
@given(TEXTS)
def test_any_text_scans_to_ordered_disjoint_spans_within_it(text: str) -> None:
    found = scan(text, BY_NAME, [BlocklistEntry("blocklist[0]", compile_words(["falcon", "a"]))])
    ends = [0]
    for f in found:
        assert ends[-1] <= f.start < f.end <= len(text)
        ends.append(f.end)

# ruff: noqa: RUF002 -- look-alike characters are this file's subject
"""The normalised view the rules match on, with every position mapped back to the original text.

A card number, an IBAN or a blocklisted word written with look-alike characters reads the same
to a person as the plain one, so the rules match on what it reads as:

1. **Invisible characters are removed**: Unicode's Default_Ignorable_Code_Point set (zero-width
   space, joiners and non-joiners, word joiner, soft hyphen, bidi marks and overrides, variation
   selectors, tag characters, Hangul fillers, ...).
2. **NFKC** (compatibility composition) on each character with its combining marks: full-width
   letters and digits, non-breaking, thin, narrow, figure and ideographic spaces (to a space),
   ligatures, circled and mathematical letters and digits, super- and subscripts.
3. **Digits folded by value**: every decimal digit (Unicode category Nd: Arabic-Indic, Eastern
   Arabic-Indic, Devanagari, Bengali, ...) to its ASCII digit.
4. **Confusables folded** to the ASCII letter they look like (Cyrillic, Greek, Armenian,
   Cherokee, Lisu, Coptic, IPA, ... letters), and hyphen look-alikes (hyphen, en dash, minus
   sign, ...) to `-`. The table is derived from Unicode's confusables.txt (UTS #39) as the
   `confusable-homoglyphs` package ships it; see `_confusable_fold` for which entries are kept.

ASCII is never changed (no leetspeak, `0` is not `O`), a letter never becomes a digit (Cyrillic
`З` is not `3`), and case is kept (Cyrillic `а` → `a`, `А` → `A`), so the detectors see exactly
what they saw before on text without look-alikes; an ASCII text is its own view at no cost.
The view is not a canonical form to store or show: it exists to be matched, then mapped back.
"""

from __future__ import annotations

import re
import string
import unicodedata
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from confusable_homoglyphs.utils import load as _load_confusables

# DerivedCoreProperties.txt, Default_Ignorable_Code_Point (Unicode 15.1): what renders as nothing.
_IGNORABLE_RANGES = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip
_FOLD_TARGETS = frozenset(string.ascii_letters + "-.")


def _confusable_fold() -> dict[str, str]:
    """Non-ASCII character → the ASCII letter (or `-`, `.`) it is confusable with.

    Kept from confusables.txt: single characters that NFKC leaves alone (NFKC already folds the
    rest), that are not decimal digits (folded by value instead: Bengali `৪` is 4, not the 8 it
    looks like) nor combining marks, and whose prototype is one ASCII letter, `-` or `.`. A
    prototype `l` on an upper-case letter is `I`: confusables.txt puts I, l and 1 in one class
    with prototype `l`, which would turn Cyrillic `І` in `ІBAN` into `lBAN`.
    """
    fold = {}
    for char, homoglyphs in _load_confusables("confusables.json").items():
        if len(char) != 1 or char.isascii() or unicodedata.category(char) in ("Nd", "Mn", "Mc", "Me"):
            continue
        if unicodedata.normalize("NFKC", char) != char:
            continue
        targets = [h["c"] for h in homoglyphs if len(h["c"]) == 1 and h["c"] in _FOLD_TARGETS]
        if targets:
            target = targets[0]
            fold[char] = "I" if target == "l" and char.isupper() else target
    return fold


_FOLD = _confusable_fold()
# A character is one of four kinds; each kind is looked up once per distinct character.
_PLAIN, _CHANGED, _IGNORABLE, _MARK = range(4)
_KINDS: dict[str, int] = {}
_VIEWS: dict[str, str] = {}
_CACHE_LIMIT = 1 << 16  # distinct characters remembered (a hostile text cannot grow it further)
# A run of non-ASCII characters with the ASCII character before it, which a combining mark in
# the run may belong to ("e" + U+0301). ASCII between runs is its own view.
_RUN = re.compile(r"[\x00-\x7f]?[^\x00-\x7f]+")


def _fold(text: str) -> str:
    out = []
    for char in text:
        if char.isascii():
            out.append(char)
        elif unicodedata.category(char) == "Nd":
            out.append(str(unicodedata.decimal(char)))
        else:
            out.append(_FOLD.get(char, char))
    return "".join(out)


def _classify(char: str) -> int:
    code = ord(char)
    if any(lo <= code <= hi for lo, hi in _IGNORABLE_RANGES):
        kind = _IGNORABLE
    elif unicodedata.combining(char):
        kind = _MARK
    else:
        view = _fold(unicodedata.normalize("NFKC", char))
        kind = _PLAIN if view == char else _CHANGED
        if kind == _CHANGED and len(_VIEWS) < _CACHE_LIMIT:
            _VIEWS[char] = view
    if len(_KINDS) < _CACHE_LIMIT:
        _KINDS[char] = kind
    return kind


def _kind(char: str) -> int:
    kind = _KINDS.get(char)
    return kind if kind is not None else _classify(char)


def _view_of(char: str) -> str:
    view = _VIEWS.get(char)
    return view if view is not None else _fold(unicodedata.normalize("NFKC", char))


def _cluster_view(chars: str) -> str:
    """A character with its combining marks: composed, folded, and composed again (a folded
    Cyrillic `е` with U+0301 composes to the `é` a Latin e with U+0301 gives)."""
    return unicodedata.normalize("NFKC", _fold(unicodedata.normalize("NFKC", chars)))


@dataclass(frozen=True)
class NormalisedText:
    """`text` as the rules see it, and where each of its characters comes from.

    The view copies the original character for character (a folded letter replaces its
    original in place) except in the pieces listed: piece k is view[view_at[k] : view_at[k] +
    view_len[k]], made from original[original_at[k] : original_end[k]] (an invisible character
    is a piece of length 0, a ligature one of length 2, a letter with its marks one made from
    several). Only length-changing pieces are listed, so most texts have none."""

    original: str
    text: str
    # Machine integers (8 bytes each, not a Python int each): a hostile text of a million
    # zero-width characters is a million pieces.
    view_at: Sequence[int] = ()
    view_len: Sequence[int] = ()
    original_at: Sequence[int] = ()
    original_end: Sequence[int] = ()

    def _char(self, at: int) -> tuple[int, int]:
        """The original characters view[at] comes from."""
        k = bisect_right(self.view_at, at) - 1
        if k < 0:
            return at, at + 1
        offset = at - self.view_at[k]
        if offset < self.view_len[k]:
            return self.original_at[k], self.original_end[k]
        start = self.original_end[k] + offset - self.view_len[k]
        return start, start + 1

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of view[start:end] (non-empty): from the first original character
        of its first character to the last of its last, so a redaction replaces exactly those
        (and the invisible characters between them). A view character made from several
        original ones (a ligature split by a match) takes all of them."""
        if not self.view_at:
            return start, end
        return self._char(start)[0], self._char(end - 1)[1]

    def position(self, at: int) -> int:
        """Where view[at:] begins in the original (0 ≤ at ≤ len(view)): at the first original
        character of view[at]; the end of the view is the end of the original."""
        if at >= len(self.text):
            return len(self.original)
        return self._char(at)[0] if self.view_at else at


def normalise(text: str) -> NormalisedText:
    """The view of `text`: an ASCII text is its own; one whose characters each stand alone is
    translated in one pass; one with combining marks is read cluster by cluster."""
    if text.isascii():
        return NormalisedText(text, text)
    return _normalise(text)


# A stream's check asks for the view of the same held text three times (scan, open_span,
# held_from): the last few views are kept rather than built again.
@lru_cache(maxsize=8)
def _normalise(text: str) -> NormalisedText:
    table: dict[int, str] = {}
    removed, expanded = [], []  # characters whose view is empty, or longer than one
    for char in set(text):
        if char.isascii():
            continue
        kind = _kind(char)
        if kind == _MARK:
            return _normalise_clusters(text)
        if kind != _PLAIN:
            view = "" if kind == _IGNORABLE else _view_of(char)
            table[ord(char)] = view
            if len(view) != 1:
                (expanded if view else removed).append(char)
    if not table:
        return NormalisedText(text, text)
    view = text.translate(table)
    if not removed and not expanded:
        return NormalisedText(text, view)
    # One piece per run of invisible characters (however long), one per expanded character.
    classes = [f"[{''.join(map(re.escape, sorted(chars)))}]" for chars in (removed, expanded) if chars]
    if removed:
        classes[0] += "+"
    pieces = array("q"), array("q"), array("q"), array("q")
    view_at, view_len, original_at, original_end = pieces
    shift = 0  # len(view so far) - len(original so far)
    for match in re.finditer("|".join(classes), text):
        start, end = match.span()
        size = len(table[ord(text[start])])
        view_at.append(start + shift)
        view_len.append(size)
        original_at.append(start)
        original_end.append(end)
        shift += size - (end - start)
    return NormalisedText(text, view, *pieces)


def _normalise_clusters(text: str) -> NormalisedText:
    """The view of a text with combining marks: each character with the marks after it is one
    cluster, composed and folded whole."""
    out: list[str] = []
    view_at, view_len, original_at, original_end = array("q"), array("q"), array("q"), array("q")
    size = 0  # length of the view so far
    done = 0  # original characters consumed so far
    for run in _RUN.finditer(text):
        start, end = run.span()
        if start > done:
            out.append(text[done:start])
            size += start - done
        i = start
        while i < end:
            char = text[i]
            kind = _kind(char)
            # The cluster: this character and the marks after it (invisibles between marks too).
            last = j = i + 1
            while j < end:
                after = _kind(text[j])
                if after == _MARK:
                    last = j + 1
                elif after != _IGNORABLE:
                    break
                j += 1
            if last == i + 1 and kind in (_PLAIN, _CHANGED):
                view = char if kind == _PLAIN else _view_of(char)
                out.append(view)
                if len(view) != 1:
                    view_at.append(size)
                    view_len.append(len(view))
                    original_at.append(i)
                    original_end.append(i + 1)
                size += len(view)
                i += 1
                continue
            if last == i + 1:
                view = "" if kind == _IGNORABLE else _cluster_view(char)
            else:
                view = _cluster_view("".join(c for c in text[i:last] if _kind(c) != _IGNORABLE))
            out.append(view)
            view_at.append(size)
            view_len.append(len(view))
            original_at.append(i)
            original_end.append(last)
            size += len(view)
            i = last
        done = end
    out.append(text[done:])
    return NormalisedText(text, "".join(out), view_at, view_len, original_at, original_end)

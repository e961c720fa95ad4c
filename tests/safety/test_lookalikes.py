# ruff: noqa: RUF001, RUF003 -- look-alike characters are this file's subject
"""Look-alike characters do not hide a blocked item: a card number, an IBAN or a blocklisted word
written with other digits, separators, invisible characters or look-alike letters is found, in
whole texts and in streams however they are cut, and its redaction replaces exactly its original
characters. Ordinary text in other scripts is not caught unless it reads as the blocked item."""

from __future__ import annotations

import itertools

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.safety.policy import BlocklistRule, SafetyPolicy
from gateway.safety.rules import BY_NAME, BlocklistEntry, compile_words, luhn_valid, redact, scan
from gateway.safety.stream import StreamHold

# The renderings, written out here (not taken from the code under test).
# Zero of: ASCII, full-width, Arabic-Indic, Eastern Arabic-Indic, Devanagari, Bengali (its 4
# looks like an 8), mathematical bold digits.
DIGIT_ZEROS = (0x30, 0xFF10, 0x0660, 0x06F0, 0x0966, 0x09E6, 0x1D7CE)
# Space, NBSP, thin, narrow NBSP, figure and ideographic spaces.
SPACES = (" ", "\u00a0", "\u2009", "\u202f", "\u2007", "\u3000")
DASHES = ("-", "\u2010", "\u2011", "\u2013", "\u2212")  # hyphen, non-breaking hyphen, en dash, minus
INVISIBLE = ("\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u200e", "\ufe0f")
LOOK_ALIKES = {
    # Cyrillic, then Greek
    "a": "аα", "c": "с", "e": "е", "i": "іι", "j": "ј", "o": "оο", "p": "рρ", "s": "ѕ", "x": "х", "y": "у",
    "A": "АΑ", "B": "ВΒ", "C": "С", "E": "ЕΕ", "H": "НΗ", "I": "ІΙ", "J": "Ј", "K": "КΚ", "M": "МΜ",
    "N": "Ν", "O": "ОΟ", "P": "РΡ", "S": "Ѕ", "T": "ТΤ", "X": "ХΧ", "Y": "Υ", "Z": "Ζ",
}  # fmt: skip
CONTEXT = ("Please", "send", "it", "to", "the", "team", "today", "Оплата", "счёт", "謝謝", "ok")
ISSUERS = ("4", "51", "55", "2221", "2720", "34", "37", "6011", "65", "35", "36")
IBAN_LENGTHS = {"DE": 22, "GB": 22, "FR": 27, "NL": 18, "NO": 15, "MT": 31}


# How one character is written and what follows it: a style index (which digit set, which
# look-alike, which case), invisibles (up to eight, so a padded item is longer than the stream's
# hold-back), a visible separator index, and where among the invisibles the separator goes.
# One pre-built strategy drawn once per character keeps generation cheap.
STYLE = st.tuples(
    st.integers(0, 255),
    st.lists(st.sampled_from(INVISIBLE), max_size=8),
    st.integers(0, 255),
    st.integers(0, 8),
)


@st.composite
def rendered(
    draw: st.DrawFn, plain: str, groups: int, visible: tuple[str, ...], any_case: bool = False
) -> str:
    """`plain` with each character rendered and the gaps between them filled; a visible separator
    (or none) goes only every `groups` characters, where a plain writer would put one."""
    styles = draw(st.lists(STYLE, min_size=len(plain), max_size=len(plain)))
    out = []
    for i, (ch, (style, invisible, sep, at)) in enumerate(zip(plain, styles, strict=True)):
        if i:
            gap = ("", *visible)[sep % (len(visible) + 1)] if i % groups == 0 else ""
            at = min(at, len(invisible))
            out.append("".join(invisible[:at]) + gap + "".join(invisible[at:]))
        if ch.isdigit():
            out.append(chr(DIGIT_ZEROS[style % len(DIGIT_ZEROS)] + int(ch)))
        elif ch == " ":
            out.append(SPACES[style % len(SPACES)])
        else:
            if any_case and style & 1:
                ch = ch.swapcase()
            options = (ch, chr(ord(ch) + 0xFEE0), *LOOK_ALIKES.get(ch, ""))  # itself, full-width, look-alikes
            out.append(options[(style >> 1) % len(options)])
    return "".join(out)


@st.composite
def cards(draw: st.DrawFn) -> str:
    issuer = draw(st.sampled_from(ISSUERS))
    length = 15 if issuer in ("34", "37") else 16
    size = length - len(issuer) - 1
    body = issuer + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=size, max_size=size)))
    check = next(d for d in "0123456789" if luhn_valid(body + d))
    assume(len(set(body + check)) > 1)
    return body + check


@st.composite
def ibans(draw: st.DrawFn) -> str:
    country = draw(st.sampled_from(sorted(IBAN_LENGTHS)))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    size = IBAN_LENGTHS[country] - 4
    bban = "".join(draw(st.lists(st.sampled_from(alphabet), min_size=size, max_size=size)))
    numeric = int("".join(str(int(ch, 36)) for ch in bban + country + "00"))
    return f"{country}{98 - numeric % 97:02d}{bban}"


def words(draw: st.DrawFn) -> str:
    return " ".join(draw(st.lists(st.sampled_from(CONTEXT), max_size=4)))


@st.composite
def in_context(draw: st.DrawFn, item: st.SearchStrategy[str]) -> tuple[str, str, str]:
    """(before, item, after): ordinary words around the item, invisibles allowed at its edges."""
    edge = st.text(st.sampled_from(INVISIBLE), max_size=2)
    before = words(draw) + draw(st.sampled_from((" ", ": ", " ("))) + draw(edge)
    after = draw(edge) + draw(st.sampled_from((" ", ". ", ") "))) + words(draw)
    return before, draw(item), after


CARD = in_context(cards().flatmap(lambda n: rendered(n, 4, SPACES + DASHES)))
IBAN = in_context(ibans().flatmap(lambda n: rendered(n, 4, SPACES[:1] + SPACES[1:5])))
WORD = "project falcon"
BLOCKED_WORD = in_context(rendered(WORD, 1, (), any_case=True))
BLOCKLIST = (BlocklistEntry("blocklist[0]", compile_words([WORD])),)
CASES = st.one_of(
    st.tuples(st.just("credit_card"), CARD),
    st.tuples(st.just("iban"), IBAN),
    st.tuples(st.just("blocklist[0]"), BLOCKED_WORD),
)


def scan_for(rule: str, text: str) -> list:
    return scan(text, [], BLOCKLIST) if rule.startswith("blocklist") else scan(text, [rule])


@settings(max_examples=120, deadline=None)
@given(CASES)
def test_a_rendered_item_is_found_and_its_redaction_replaces_exactly_its_characters(
    case: tuple[str, tuple[str, str, str]],
) -> None:
    rule, (before, item, after) = case
    text = before + item + after
    found = scan_for(rule, text)
    assert [(f.rule, f.start, f.end) for f in found] == [(rule, len(before), len(before) + len(item))]
    assert redact(text, found) == f"{before}[REDACTED:{rule}]{after}"


def hold(rule: str, action: str) -> StreamHold:
    blocklist = (BlocklistRule(BLOCKLIST[0], action),) if rule.startswith("blocklist") else ()
    rules = {} if blocklist else {rule: action}
    policy = SafetyPolicy(rules=rules, blocklist=blocklist, hold_back_chars=96)  # type: ignore[arg-type]
    return StreamHold(policy, tuple(rules), policy.blocklist_entries())


def stream(h: StreamHold, text: str, cuts: list[int]) -> tuple[str, bool]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(points)):
        release = h.feed(text[a:b], final=i == len(points) - 2)
        if release.blocked:
            return "".join(out), True
        out.append(release.text)
    return "".join(out), False


@settings(max_examples=80, deadline=None)
@given(CASES, st.lists(st.integers(min_value=0), max_size=40))
def test_a_streamed_item_is_redacted_whole_however_it_is_cut(
    case: tuple[str, tuple[str, str, str]], cuts: list[int]
) -> None:
    rule, (before, item, after) = case
    released, blocked = stream(hold(rule, "redact"), before + item + after, cuts)
    assert not blocked and released == f"{before}[REDACTED:{rule}]{after}"


@settings(max_examples=80, deadline=None)
@given(CASES, st.lists(st.integers(min_value=0), max_size=40))
def test_a_streamed_blocked_item_is_never_released_in_part(
    case: tuple[str, tuple[str, str, str]], cuts: list[int]
) -> None:
    rule, (before, item, after) = case
    text = before + item + after
    released, blocked = stream(hold(rule, "block"), text, cuts)
    assert blocked and text.startswith(released) and len(released) <= len(before)


def test_a_card_padded_past_the_hold_back_with_invisibles_is_held_whole() -> None:
    card = "\u200b" * 8 + "\u200b\u200b\u200b\u200b\u200b\u200b\u200b\u200b".join("4111111111111111")
    assert len(card) > 96  # the hold-back, in characters of the original
    text = "pay " + card + " now"
    released, blocked = stream(hold("credit_card", "block"), text, list(range(0, len(text), 3)))
    assert blocked and released == "pay "[: len(released)]


def test_digits_fold_by_value_not_by_look() -> None:
    bengali = "".join(chr(0x09E6 + int(d)) for d in "4111111111111111")  # ৪ looks like 8
    assert [f.rule for f in scan(bengali, ["credit_card"])] == ["credit_card"]


def test_a_blocklist_word_written_with_look_alikes_in_the_policy_matches_plain_text() -> None:
    # Full-width letters; a Cyrillic о and a non-breaking space.
    entry = BlocklistEntry("blocklist[0]", compile_words(["ｆａｌｃｏｎ", "prоject\u00a0x"]))
    text = "the falcon and project x"
    assert [text[f.start : f.end] for f in scan(text, [], [entry])] == ["falcon", "project x"]


# -- no false positives in other scripts -----------------------------------------------------------

ORDINARY = (
    "Привет! Как дела? Сегодня мы обсудим отчёт за третий квартал и планы на следующий год.",
    "Москва — столица России, в ней живёт около тринадцати миллионов человек.",
    "Καλημέρα σας, πώς είστε; Η συνάντηση θα γίνει αύριο στις δέκα το πρωί.",
    "مرحبا، الاجتماع يوم ٢٠٢٤/٠٣/١٥ في الساعة ١٠:٣٠ صباحا، رقم الغرفة ١٢.",
    "नमस्ते, बैठक १५ मार्च २०२४ को सुबह १० बजे होगी।",
    "会议将于二〇二四年三月十五日上午十点举行，请准时参加。",
    "Բարև, ինչպե՞ս ես։ Վաղը կհանդիպենք։",
    "Tiếng Việt có dấu: chúng tôi sẽ gặp nhau vào ngày mai.",
)
ENGLISH_BLOCKLIST = ("cat", "home", "paper", "copy", "top", "stop", "hot", "money", "secret", "bomb")


def test_ordinary_text_in_other_scripts_matches_no_rule_and_no_english_word() -> None:
    entry = BlocklistEntry("blocklist[0]", compile_words(ENGLISH_BLOCKLIST))
    for text in ORDINARY:
        assert scan(text, BY_NAME, [entry]) == [], text


# Cyrillic letters with no Latin look-alike (upper-case В, К, М, Н, Т, Ь have one, and г looks
# like r): a word with one of them never reads as English.
UNLIKE = set("бвджзийклмнптфцчшщъыьэюяБГДЖЗИЙЛПФЦЧШЩЪЫЭЮЯ")
CYRILLIC = "абвгдежзийклмнопрстуфхцчшщъыьэюя"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(st.sampled_from(CYRILLIC + CYRILLIC.upper()), min_size=1, max_size=8), min_size=1),
    st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz"), min_size=2, max_size=8),
)
def test_a_russian_word_matches_an_english_blocklist_word_only_if_it_reads_as_it(
    russian: list[str], word: str
) -> None:
    text = " ".join(russian)
    found = scan(text, [], [BlocklistEntry("blocklist[0]", compile_words([word]))])
    for f in found:
        assert not set(text[f.start : f.end]) & UNLIKE


def test_the_trade_off_a_russian_word_made_of_look_alikes_reads_as_english() -> None:
    # "сор" (litter) is written with Cyrillic с, о, р: it reads as "cop", and is caught as it.
    entry = BlocklistEntry("blocklist[0]", compile_words(["cop"]))
    assert [f.rule for f in scan("на полу сор", [], [entry])] == ["blocklist[0]"]

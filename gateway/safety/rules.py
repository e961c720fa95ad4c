"""The rules layer: detectors for secrets and personal data, and per-tenant blocklists.

Pure and fast (regular expressions, then a checksum where the format has one, so a
Luhn-invalid number is not a card and an IBAN must pass mod-97). Each detector has a name
(the rule a policy names), a category (`secret` or `pii`) and, for text that arrives in pieces,
an optional `opener`: the start of a match that can be longer than a stream's hold-back window
(a PEM private key), so the stream holds from there until the whole match is seen.

Everything matches on the normalised view of the text (normalise.py: invisible characters
removed, NFKC, digits and look-alike letters folded), and every position a function here
returns is a position in the original text, so a redaction replaces the original characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.safety.normalise import normalise


@dataclass(frozen=True)
class Finding:
    """One match: the rule that fired, its category, and the span of the checked text."""

    rule: str
    category: str
    start: int
    end: int


@dataclass(frozen=True)
class Detector:
    name: str
    category: str  # "secret" or "pii"
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] | None = None  # a checksum the matched text must pass
    opener: re.Pattern[str] | None = None
    # Literals one of which every match contains: a text without any is not searched at all
    # (a substring test costs microseconds per KB, a regex scan a hundred).
    hints: tuple[str, ...] = ()

    def find(self, text: str) -> Iterable[Finding]:
        """Findings in `text` as given (scan passes the normalised view and maps them back)."""
        if self.hints and not any(hint in text for hint in self.hints):
            return
        for match in self.pattern.finditer(text):
            if self.valid is None or self.valid(match.group()):
                yield Finding(self.name, self.category, match.start(), match.end())


# -- checksums ---------------------------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    """The Luhn check every payment card number passes (ISO/IEC 7812)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_valid(text: str) -> bool:
    digits = re.sub(r"[ -]", "", text)
    # 13-19 digits, a known issuer prefix (Visa 4, Mastercard 51-55/22-27, Amex 34/37, Discover
    # 6011/65, JCB 35, Diners 36/38, UnionPay 62), and Luhn. Repeated digits are test fillers.
    return (
        13 <= len(digits) <= 19
        and re.match(r"4|5[1-5]|2[2-7]|3[4-8]|6", digits) is not None
        and len(set(digits)) > 1
        and luhn_valid(digits)
    )


# Lengths per country (ISO 13616 registry); unknown countries are not IBANs here.
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BR": 29, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20,
    "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27,
    "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30,
    "KZ": 20, "LB": 28, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29,
    "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SE": 24, "SI": 19, "SK": 24, "SM": 27,
    "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}  # fmt: skip


def iban_valid(text: str) -> bool:
    """ISO 13616: the country's length, then mod 97 of the rearranged number is 1."""
    iban = re.sub(r"\s", "", text).upper()
    if IBAN_LENGTHS.get(iban[:2]) != len(iban):
        return False
    rearranged = iban[4:] + iban[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def us_ssn_valid(text: str) -> bool:
    """SSA rules: area not 000, 666 or 9xx; group not 00; serial not 0000."""
    area, group, serial = re.split(r"[- ]", text)
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def uk_nino_valid(text: str) -> bool:
    """HMRC: prefixes BG, GB, KN, NK, NT, TN, ZZ are never issued (letters D, F, I, Q, U, V and a
    second-letter O are excluded by the pattern)."""
    prefix = text[:2].upper()
    return prefix not in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ")


_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def es_dni_valid(text: str) -> bool:
    """Spain's DNI/NIE: the letter is the number mod 23 (an NIE's X/Y/Z counts as 0/1/2)."""
    text = text.upper()
    number = text[:-1]
    if number[0] in "XYZ":
        number = str("XYZ".index(number[0])) + number[1:]
    return _DNI_LETTERS[int(number) % 23] == text[-1]


# -- detectors ---------------------------------------------------------------------------------

_B = r"(?<![A-Za-z0-9_-])"  # not inside a longer token
_E = r"(?![A-Za-z0-9_-])"
# Patterns start with a character class, and check what precedes the match with a lookbehind
# after that first character: Python's regex engine then skips positions that cannot start a
# match in C, which a leading lookbehind or \b defeats (several times slower on prose).

DETECTORS: tuple[Detector, ...] = (
    Detector("anthropic_key", "secret", re.compile(_B + r"sk-ant-[A-Za-z0-9_-]{20,}"), hints=("sk-ant-",)),
    Detector(
        "openai_key",
        "secret",
        re.compile(_B + r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        hints=("sk-",),
    ),
    Detector(
        "aws_access_key",
        "secret",
        re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"),
        hints=("AKIA", "ASIA"),
    ),
    Detector(
        "github_token",
        "secret",
        re.compile(_B + r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{60,})"),
        hints=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    Detector("slack_token", "secret", re.compile(_B + r"xox[abposr]-[A-Za-z0-9-]{10,}"), hints=("xox",)),
    Detector("google_api_key", "secret", re.compile(_B + r"AIza[A-Za-z0-9_-]{35}" + _E), hints=("AIza",)),
    Detector(
        "jwt",
        "secret",
        re.compile(_B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        hints=("eyJ",),
    ),
    Detector(
        "private_key",
        "secret",
        re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z]+ )*PRIVATE KEY-----"),
        opener=re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----"),
        hints=("-----BEGIN ",),
    ),
    Detector(
        "email",
        "pii",
        re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}\b"),
        hints=("@",),
    ),
    Detector(
        "credit_card",
        "pii",
        re.compile(r"\d(?<![\d-]\d)(?:[ -]?\d){12,18}(?![\d-])"),
        valid=_card_valid,
    ),
    Detector(
        "iban",
        "pii",
        re.compile(r"[A-Z](?<![A-Za-z0-9_][A-Z])[A-Z]\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"),
        valid=iban_valid,
    ),
    Detector(
        "us_ssn",
        "pii",
        re.compile(r"\d(?<![\d-]\d)\d{2}-\d{2}-\d{4}(?![\d-])"),
        valid=us_ssn_valid,
        hints=("-",),
    ),
    Detector(
        "uk_nino",
        "pii",
        re.compile(
            r"[A-CEGHJ-PR-TW-Z](?<![A-Za-z0-9_][A-Z])[A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
        ),
        valid=uk_nino_valid,
    ),
    Detector(
        "es_dni", "pii", re.compile(r"[XYZ0-9](?<![A-Za-z0-9_][XYZ0-9])\d{7}[A-Za-z]\b"), valid=es_dni_valid
    ),
    # E.164-ish: a leading + and country code, 8-15 digits with the usual separators; or a North
    # American number as it is written at home, `(415) 555-2671` or `415-555-2671` / `.`, with
    # NANP's rules (area code and exchange start with 2-9). Bare digit runs (order numbers,
    # timestamps) are not phones; neither is anything a card/IBAN claimed.
    Detector(
        "phone",
        "pii",
        re.compile(
            r"\+(?<![\w+]\+)[1-9]\d{0,2}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?![\w])"
            r"|\((?<!\w\()[2-9]\d{2}\) ?[2-9]\d{2}[-.]\d{4}(?![\w-]|\.\d)"
            r"|[2-9](?<![\w.+-][2-9])\d{2}([-.])[2-9]\d{2}\1\d{4}(?![\w-]|\.\d)"
        ),
        valid=lambda text: 8 <= sum(ch.isdigit() for ch in text) <= 15,
    ),
)
BY_NAME = {d.name: d for d in DETECTORS}
# Names a policy may use for several rules at once.
GROUPS: dict[str, tuple[str, ...]] = {
    "secrets": tuple(d.name for d in DETECTORS if d.category == "secret"),
    "pii": tuple(d.name for d in DETECTORS if d.category == "pii"),
    "national_id": ("us_ssn", "uk_nino", "es_dni"),
}


@dataclass(frozen=True)
class BlocklistEntry:
    """A tenant's words (whole words, case-insensitive) or regex, as one compiled pattern."""

    name: str  # as audit records name it: "blocklist[0]"
    pattern: re.Pattern[str]


# What keeps the words of a phrase apart in text: any run of whitespace (a line break, a tab, two
# spaces), hyphens or underscores. "project falcon" is also "project  falcon", "project\nfalcon"
# (text from a document), "project-falcon" and "project_falcon" to whoever reads it.
_APART = r"[\s_-]+"


def compile_words(words: Iterable[str]) -> re.Pattern[str]:
    """The words as the normalised view spells them (a word written with a full-width letter or
    a non-breaking space matches its plain form), the words of a phrase apart by any `_APART`. A
    tenant's regex is matched as written, so it should be written in plain characters (the view
    never holds a full-width one)."""
    phrases = {tuple(part for part in re.split(_APART, normalise(w).text) if part) for w in words}
    phrases.discard(())  # a word of invisible characters or separators alone is none
    alternatives = "|".join(
        _APART.join(map(re.escape, phrase))
        for phrase in sorted(phrases, key=lambda p: sum(map(len, p)), reverse=True)
    )
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def scan(text: str, rules: Iterable[str], blocklist: Iterable[BlocklistEntry] = ()) -> list[Finding]:
    """Every finding of the named detectors and the blocklist in `text`, by position; where two
    overlap, the earlier (then longer) one wins, so one digit run is one finding."""
    view = normalise(text)
    in_view: list[Finding] = []
    for name in rules:
        in_view.extend(BY_NAME[name].find(view.text))
    for entry in blocklist:
        for match in entry.pattern.finditer(view.text):
            if match.end() > match.start():
                in_view.append(Finding(entry.name, "blocklist", match.start(), match.end()))
    found = [Finding(f.rule, f.category, *view.span(f.start, f.end)) for f in in_view]
    found.sort(key=lambda f: (f.start, -f.end))
    kept: list[Finding] = []
    for finding in found:
        if kept and finding.start < kept[-1].end:
            continue
        kept.append(finding)
    return kept


def open_span(text: str, rules: Iterable[str]) -> int | None:
    """Where an unfinished long match (an opener with no complete match after it) starts."""
    view = normalise(text)
    earliest: int | None = None
    for name in rules:
        detector = BY_NAME[name]
        if detector.opener is None:
            continue
        for match in detector.opener.finditer(view.text):
            if detector.pattern.match(view.text, match.start()) is None:
                earliest = match.start() if earliest is None else min(earliest, match.start())
                break
    return None if earliest is None else view.position(earliest)


def held_from(text: str, hold_back: int) -> int:
    """Where the last `hold_back` characters of the normalised view begin in `text`: a stream
    holds from there, so a hold-back counts characters as the rules see them and a match
    stretched with invisible characters is still held whole until it can be recognised."""
    view = normalise(text)
    return view.position(max(0, len(view.text) - hold_back))


def redact(text: str, findings: Iterable[Finding]) -> str:
    """`text` with each finding replaced by `[REDACTED:<rule>]`."""
    out: list[str] = []
    at = 0
    for finding in sorted(findings, key=lambda f: f.start):
        if finding.start < at:
            continue
        out.append(text[at : finding.start])
        out.append(f"[REDACTED:{finding.rule}]")
        at = finding.end
    out.append(text[at:])
    return "".join(out)


_SECRET_RULES = GROUPS["secrets"]
_ALL_RULES = tuple(BY_NAME)


def redact_secrets(text: str, *, personal_data: bool = True) -> str:
    """The helper logging and tracing call on anything they write: secrets (and by default
    personal data) replaced, so a key pasted into a prompt never reaches a log line or span."""
    return redact(text, scan(text, _ALL_RULES if personal_data else _SECRET_RULES))

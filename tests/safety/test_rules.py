"""The rules layer's detectors: each with texts it must find and look-alikes it must not."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.safety.rules import (
    BY_NAME,
    BlocklistEntry,
    compile_words,
    iban_valid,
    luhn_valid,
    redact,
    redact_secrets,
    scan,
)

POSITIVES = {
    "openai_key": ["key sk-proj-Abcdefghijklmnopqrstuvwx123 here", "sk-abcdefghijklmnopqrstuvwxyz012345"],
    "anthropic_key": ["sk-ant-api03-abcdefghijklmnopqrstuvwxyz_-0123"],
    "aws_access_key": ["id=AKIAIOSFODNN7EXAMPLE;", "ASIAABCDEFGHIJKLMNOP"],
    "github_token": ["ghp_" + "a1" * 18, "github_pat_" + "B2_" * 21],
    "slack_token": ["xoxb-1234567890-abcdefghij"],
    "google_api_key": ["AIza" + "x" * 35],
    "jwt": ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"],
    "private_key": ["-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"],
    "email": ["write to jane.doe+news@example.co.uk today"],
    "credit_card": ["4111 1111 1111 1111", "5555-5555-5555-4444", "378282246310005"],
    "iban": ["GB82 WEST 1234 5698 7654 32", "DE89370400440532013000"],
    "us_ssn": ["ssn 123-45-6789"],
    "uk_nino": ["AB 12 34 56 C", "JG103759A"],
    "es_dni": ["12345678Z", "X1234567L"],
    "phone": [
        "+44 20 7946 0958",
        "+1 (415) 555-2671",
        "+14155552671",
        "call (415) 555-2671 today",
        "call 415-555-2671.",
        "or 415.555.2671",
    ],
}

NEGATIVES = {
    "openai_key": ["sk-short", "task-abcdefghijklmnopqrstuvwxyz"],
    "anthropic_key": ["sk-ant-short"],
    "aws_access_key": ["AKIA1234", "XAKIAIOSFODNN7EXAMPLEX"],
    "github_token": ["ghp_tooshort"],
    "slack_token": ["xoxz-1234567890-abc"],
    "google_api_key": ["AIza" + "x" * 10],
    "jwt": ["eyJ.eyJ.sig", "header.payload.signature"],
    "private_key": ["-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----"],
    "email": ["user at example dot com", "@handle", "a@b"],
    "credit_card": [
        "4111 1111 1111 1112",
        "1234 5678 9012 3456",
        "0000 0000 0000 0000",
        "order 20240101123456",
    ],
    "iban": ["GB82 WEST 1234 5698 7654 33", "XX82WEST12345698765432", "GB82WEST123"],
    "us_ssn": ["000-12-3456", "666-12-3456", "912-12-3456", "123-00-4567", "123-45-0000"],
    "uk_nino": ["GB 12 34 56 C", "QQ 12 34 56 C", "DA 12 34 56 C", "AB 12 34 56 E"],
    "es_dni": ["12345678A", "X1234567A"],
    "phone": [
        "call 4155552671",
        "version 1.2.3.4",
        "+12",
        "2024-01-02",
        "id 123-456-7890",  # no area code starts with 1
        "ref 415-555-26712",
        "v4.415.555.2671.2",
        "x-415-555-2671",
    ],
}


@pytest.mark.parametrize(("rule", "text"), [(r, t) for r, texts in POSITIVES.items() for t in texts])
def test_detector_finds_its_format(rule: str, text: str) -> None:
    assert [f.rule for f in scan(text, [rule])] == [rule]


@pytest.mark.parametrize(("rule", "text"), [(r, t) for r, texts in NEGATIVES.items() for t in texts])
def test_detector_ignores_look_alikes(rule: str, text: str) -> None:
    assert scan(text, [rule]) == []


def test_every_detector_has_positive_and_negative_cases() -> None:
    assert set(POSITIVES) == set(BY_NAME) == set(NEGATIVES)


def test_luhn_and_iban_checksums() -> None:
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert iban_valid("GB82 WEST 1234 5698 7654 32") and not iban_valid("GB82 WEST 1234 5698 7654 23")


def test_a_luhn_invalid_number_is_not_a_card_even_among_valid_ones() -> None:
    text = "paid with 4111 1111 1111 1112 then 4111 1111 1111 1111"
    found = scan(text, ["credit_card"])
    assert [text[f.start : f.end] for f in found] == ["4111 1111 1111 1111"]


def test_blocklist_words_match_whole_words_case_insensitively() -> None:
    entry = BlocklistEntry("blocklist[0]", compile_words(["Project Falcon", "secret"]))
    text = "about project falcon and secrets and SECRET."
    found = scan(text, [], [entry])
    assert [text[f.start : f.end] for f in found] == ["project falcon", "SECRET"]


WORDS = st.lists(
    st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=2, max_size=8),
    min_size=1,
    max_size=3,
)
# Separators a reader sees as "apart": whitespace of any kind (a non-breaking or an em space
# included: the view makes them spaces), line breaks, hyphens, underscores, in runs.
APART = st.text([" ", "\n", "\t", "\r", "-", "_", "\u00a0", "\u2003"], min_size=1, max_size=4)


@given(words=WORDS, data=st.data())
def test_a_blocklisted_phrase_matches_however_its_words_are_kept_apart(
    words: list[str], data: st.DataObject
) -> None:
    """Two spaces or a line break between the words of "project falcon" let it through once."""
    entry = BlocklistEntry("blocklist[0]", compile_words([" ".join(words)]))
    written = words[0] + "".join(data.draw(APART) + word for word in words[1:])
    text = f"about {written}, then."
    found = scan(text, [], [entry])
    assert [text[f.start : f.end] for f in found] == [written]


@given(words=WORDS.filter(lambda w: len(w) > 1), glue=st.sampled_from(["", "x", "1", "."]))
def test_a_phrase_glued_into_other_words_is_not_the_phrase(words: list[str], glue: str) -> None:
    entry = BlocklistEntry("blocklist[0]", compile_words([" ".join(words)]))
    text = f"about {glue.join(words)} then"
    assert scan(text, [], [entry]) == []


@given(
    area=st.integers(200, 999),
    exchange=st.integers(200, 999),
    line=st.integers(0, 9999),
    form=st.sampled_from(["({a}) {e}-{n}", "({a}){e}-{n}", "{a}-{e}-{n}", "{a}.{e}.{n}"]),
    before=st.sampled_from(["call ", "at: ", "(", "\n", ""]),
    after=st.sampled_from([" today", ".", ", or", ")", ""]),
)
def test_a_north_american_number_is_a_phone_however_it_is_written(
    area: int, exchange: int, line: int, form: str, before: str, after: str
) -> None:
    number = form.format(a=area, e=exchange, n=f"{line:04d}")
    text = before + number + after
    assert [text[f.start : f.end] for f in scan(text, ["phone"])] == [number]


def test_redact_replaces_each_finding_with_its_rule_name() -> None:
    text = "mail jane@example.com key AKIAIOSFODNN7EXAMPLE"
    assert redact(text, scan(text, BY_NAME)) == "mail [REDACTED:email] key [REDACTED:aws_access_key]"


def test_redact_secrets_helper_for_logs_can_keep_personal_data() -> None:
    text = "jane@example.com sk-proj-Abcdefghijklmnopqrstuvwx123"
    assert redact_secrets(text) == "[REDACTED:email] [REDACTED:openai_key]"
    assert redact_secrets(text, personal_data=False) == "jane@example.com [REDACTED:openai_key]"

"""Decoding request bodies: hostile bytes are 400s naming the problem, never an unexpected error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ChatCompletionRequest, InvalidRequestError, decode_request
from protocol.openai import MAX_JSON_DEPTH, json_depth_exceeds

VALID = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body_with(extra: str) -> bytes:
    return json.dumps(VALID).encode()[:-1] + b', "x": ' + extra.encode() + b"}"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "m\xe2\x98", "messages": []}',  # a truncated sequence inside "model"
        b'{"model": "m", "messages": [], "\xc0\xaf": 1}',  # an overlong encoding in a key
    ],
)
def test_invalid_utf8_is_a_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError, match="not valid UTF-8"):
        decode_request(raw, ChatCompletionRequest)


def test_nesting_past_the_limit_is_a_400_without_recursing() -> None:
    with pytest.raises(InvalidRequestError, match=f"more than {MAX_JSON_DEPTH} levels"):
        decode_request(body_with("[" * 1000 + "]" * 1000), ChatCompletionRequest)
    with pytest.raises(InvalidRequestError, match="levels deep"):
        decode_request(body_with('{"a":' * 200 + "1" + "}" * 200), ChatCompletionRequest)
    # Unbalanced, deeper than Python's recursion limit: refused before the parser sees it.
    with pytest.raises(InvalidRequestError, match="levels deep"):
        decode_request(b"[" * 100_000, ChatCompletionRequest)


def test_nesting_up_to_the_limit_is_accepted() -> None:
    depth = MAX_JSON_DEPTH - 1  # the body's own object is one level
    request = decode_request(body_with("[" * depth + "]" * depth), ChatCompletionRequest)
    assert request.model == "m"


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps('[{"\\"' * 1000)  # quotes and backslashes escaped inside the string
    assert not json_depth_exceeds(body_with(text))
    assert decode_request(body_with(text), ChatCompletionRequest).model == "m"


@given(depth=st.integers(0, 400), wrap=st.sampled_from("[{"))
@settings(max_examples=60, deadline=None)
def test_depth_check_agrees_with_the_real_depth(depth: int, wrap: str) -> None:
    inner = ('{"k":' * depth + "1" + "}" * depth) if wrap == "{" else ("[" * depth + "]" * depth)
    assert json_depth_exceeds(inner.encode()) == (depth > MAX_JSON_DEPTH)

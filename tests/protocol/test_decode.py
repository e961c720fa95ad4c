"""Decoding request bodies: hostile bytes are 400s naming the problem, never an unexpected error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import ChatCompletionRequest, CompletionRequest, InvalidRequestError, decode_request
from protocol.anthropic import MessagesRequest
from protocol.openai import MAX_JSON_DEPTH, decode_request_and_object, json_depth_exceeds

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


# Every integer field of each request, with what the rest of a valid request needs.
_REQUESTS = [
    (
        ChatCompletionRequest,
        VALID,
        ("max_tokens", "seed", "n", "top_k", "max_completion_tokens", "top_logprobs"),
    ),
    (
        CompletionRequest,
        {"model": "m", "prompt": "hi"},
        ("max_tokens", "seed", "n", "top_k", "logprobs", "best_of"),
    ),
    (
        MessagesRequest,
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        ("max_tokens", "top_k"),
    ),
]


@pytest.mark.parametrize(
    ("request_type", "base", "fields"), _REQUESTS, ids=lambda v: getattr(v, "__name__", "")
)
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_a_whole_number_in_an_integer_field_is_that_integer_and_a_fraction_is_a_400(
    request_type: type, base: dict[str, Any], fields: tuple[str, ...], data: st.DataObject
) -> None:
    """JSON Schema, the OpenAPI document's dialect, counts 5.0 as an integer (schemathesis sends
    it): the door takes it as 5, in the struct and in the body it forwards; 5.5 names the field."""
    name = data.draw(st.sampled_from(fields))
    whole = data.draw(st.integers(1, 5))
    body = {**base, name: float(whole)}
    parsed, raw = decode_request_and_object(json.dumps(body).encode(), request_type)
    assert getattr(parsed, name) == whole and type(raw[name]) is int and raw[name] == whole
    fraction = whole + data.draw(st.sampled_from([0.5, 0.25, 1e-6]))
    with pytest.raises(InvalidRequestError) as refused:
        decode_request_and_object(json.dumps({**base, name: fraction}).encode(), request_type)
    assert refused.value.param == name

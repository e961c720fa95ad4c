"""Batch input files (gateway/batches/input.py): what a batch's file is refused for, naming the
line; and that whatever a file holds, it is read or refused with a BatchInputError (a failed
batch naming the fault), never another exception (a 500: schemathesis-style bodies found a `url`
that was a JSON array, and a line nesting deeper than json's parser can recurse)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.batches.errors import BatchInputError
from gateway.batches.input import parse_input


def _line(custom_id: str = "a", url: str = "/v1/chat/completions", **extra: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "m"}, **extra})


def test_good_lines_are_read_in_order_with_their_line_numbers() -> None:
    data = "\n".join([_line("a"), "", _line("b", "/v1/completions")]).encode()
    lines = parse_input(data, max_lines=10)
    assert [(ln.line_no, ln.custom_id, ln.url) for ln in lines] == [
        (1, "a", "/v1/chat/completions"),
        (3, "b", "/v1/completions"),
    ]


@pytest.mark.parametrize(
    ("data", "code", "says"),
    [
        (_line("a") + "\n{not json", "invalid_json_line", "Line 2"),
        ("[1, 2]", "invalid_json_line", "Line 1"),
        (_line("a", "/v1/embeddings"), "invalid_url", "/v1/embeddings"),
        (_line("a") + "\n" + _line("a"), "duplicate_custom_id", "line 1"),
        ("", "empty_file", "no requests"),
        (_line("a", ["/v1/completions"]), "invalid_url", "not supported"),  # type: ignore[arg-type]
        (
            '{"custom_id": "a", "body": ' + "[" * 50_000 + "]" * 50_000 + "}",
            "invalid_json_line",
            "levels deep",
        ),
        (
            json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}),
            "invalid_request",
            "POST",
        ),
    ],
)
def test_a_bad_file_is_refused_with_a_clear_error(data: str, code: str, says: str) -> None:
    with pytest.raises(BatchInputError) as refused:
        parse_input(data.encode(), max_lines=10)
    assert refused.value.code == code
    assert says in refused.value.message


def test_too_many_lines_are_refused() -> None:
    data = "\n".join(_line(str(i)) for i in range(4)).encode()
    with pytest.raises(BatchInputError) as refused:
        parse_input(data, max_lines=3)
    assert refused.value.code == "too_many_lines"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
# Mostly lines a client would write, each field now and then any JSON at all.
lines = st.fixed_dictionaries(
    {
        "custom_id": st.text(min_size=1, max_size=6) | json_values,
        "method": st.just("POST") | json_values,
        "url": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]) | json_values,
        "body": st.fixed_dictionaries({"model": st.just("m")}, optional={"stream": json_values})
        | json_values,
    }
)


@settings(max_examples=400, deadline=None)
@given(st.lists(lines | json_values, min_size=0, max_size=4), st.integers(0, 3))
def test_any_file_is_read_or_refused_with_a_batch_input_error(items: list[object], deep: int) -> None:
    text = "\n".join(json.dumps(item) for item in items)
    if deep:  # a line nesting deeper than any request needs, at the start, middle or end
        nested = "[" * 5_000 + "]" * 5_000
        text = {1: nested + "\n" + text, 2: text + "\n" + nested, 3: f'{{"custom_id": {nested}}}'}[deep]
    try:
        parsed = parse_input(text.encode(), max_lines=10)
    except BatchInputError as refused:
        assert refused.message and refused.code
        return
    assert all(line.url in ("/v1/chat/completions", "/v1/completions") for line in parsed)

"""Batch input files (gateway/batches/input.py): what an upload refuses, naming the line."""

from __future__ import annotations

import json

import pytest

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

"""The SSE line reader the gateway reads node streams with is bounded: an upstream that never
ends its line is a malformed stream, not a buffer that grows until the gateway runs out of memory."""

from __future__ import annotations

import pytest

from protocol.sse import DataLines, LineTooLong


def test_a_line_that_never_ends_is_refused_once_past_the_bound() -> None:
    lines = DataLines(max_line_bytes=1024)
    assert lines.feed(b'data: {"a": 1}\n\ndata: {"b"') == [b'{"a": 1}']
    with pytest.raises(LineTooLong):
        for _ in range(100):
            lines.feed(b"x" * 64)


def test_lines_under_the_bound_pass_whole() -> None:
    lines = DataLines(max_line_bytes=1024)
    assert lines.feed(b"data: " + b"y" * 1000) == []
    assert lines.feed(b"\n") == [b"y" * 1000]

"""Numbers read from query strings, the way every server here reads them."""

from __future__ import annotations


def query_count(text: str, *, max_digits: int = 18) -> int | None:
    """`text` as a non-negative integer written in ASCII digits, at most `max_digits` of them;
    None for anything else. `str.isdigit()` alone is not enough: "²" is a digit that int()
    refuses, and int() refuses more than 4,300 digits (both were 500s)."""
    if text.isascii() and text.isdigit() and len(text) <= max_digits:
        return int(text)
    return None

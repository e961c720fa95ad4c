"""Hypothesis strategies the tool-calling translation tests share: tool names, short texts, and
tool inputs (JSON objects, as a tool_use block's `input` and a call's parsed arguments are)."""

from __future__ import annotations

from hypothesis import strategies as st

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
texts = st.text(max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)

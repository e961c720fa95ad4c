"""Hypothesis strategies the tool-calling translation tests share: tool names, short texts, tool
inputs (JSON objects, as a tool_use block's `input` and a call's parsed arguments are), and the
pipeline's streamed answers of text and tool calls, as an upstream sends them and as output safety
releases them."""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import strategies as st

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
texts = st.text(max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)


def split_at(text: str, cuts: list[int]) -> list[str]:
    points = [0, *sorted(cut % (len(text) + 1) for cut in cuts), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(points)]


def delta_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@st.composite
def streamed_answers(draw: st.DrawFn) -> tuple[list[dict[str, Any]], str, list[dict[str, Any]]]:
    """An OpenAI stream's chunks: text, then tool calls (each announced with its id and name, its
    arguments split at random, sometimes starting in the announcing delta), finish and usage; the
    text and the calls it carries."""
    text = draw(st.text(max_size=20))
    calls = [
        {"id": f"call_{k}", "name": draw(names), "input": draw(json_objects)}
        for k in range(draw(st.integers(0, 3)))
    ]
    chunks = [delta_chunk({"role": "assistant", "content": ""})]
    chunks += [
        delta_chunk({"content": piece})
        for piece in split_at(text, draw(st.lists(st.integers(0, 99), max_size=4)))
    ]
    for k, call in enumerate(calls):
        arguments = json.dumps(call["input"], ensure_ascii=draw(st.booleans()))
        pieces = split_at(arguments, draw(st.lists(st.integers(0, 999), max_size=5)))
        first = pieces.pop(0) if draw(st.booleans()) else ""
        function = {"name": call["name"], "arguments": first}
        chunks.append(
            delta_chunk(
                {"tool_calls": [{"index": k, "id": call["id"], "type": "function", "function": function}]}
            )
        )
        chunks += [delta_chunk({"tool_calls": [{"index": k, "function": {"arguments": p}}]}) for p in pieces]
    chunks.append(delta_chunk({}, "tool_calls" if calls else "stop"))
    chunks.append({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 7}})
    return chunks, text, calls


def held_back(chunks: list[dict[str, Any]], hold: int) -> list[dict[str, Any]]:
    """The chunks as output safety releases them: each channel's last `hold` characters held until
    the finish, where what is held comes out (a call's announcement, id and name, passes at once)."""
    pending: dict[str, str] = {}
    out = []
    for chunk in chunks:
        choices = chunk["choices"]
        if not choices:
            out.append(chunk)
            continue
        delta, finish = choices[0]["delta"], choices[0]["finish_reason"]
        released: dict[str, Any] = {k: v for k, v in delta.items() if k == "role"}
        if "content" in delta:
            pending["content"] = pending.get("content", "") + delta["content"]
        for call in delta.get("tool_calls", []):
            channel = f"tool:{call['index']}"
            pending[channel] = pending.get(channel, "") + call["function"].get("arguments", "")
            if "id" in call:
                released.setdefault("tool_calls", []).append(
                    {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
                )
        for channel, text in pending.items():
            cut = len(text) if finish is not None else max(0, len(text) - hold)
            if not cut:
                continue
            pending[channel] = text[cut:]
            if channel == "content":
                released["content"] = text[:cut]
            else:
                index = int(channel.removeprefix("tool:"))
                calls = released.setdefault("tool_calls", [])
                call = next((c for c in calls if c["index"] == index), None)
                if call is None:
                    calls.append({"index": index, "function": {"arguments": text[:cut]}})
                else:
                    call["function"]["arguments"] = text[:cut]
        out.append(delta_chunk(released, finish))
    return out

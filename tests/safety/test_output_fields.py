"""Output checks over every field that carries model text (gateway/safety/output.py), driven by
hypothesis on typed chunks: any split of the text into chunks and tokens, in any channel (content,
refusal, reasoning, tool-call arguments), with logprobs and alternatives.

The invariants, streamed and whole alike:
- no field of what the client gets holds a redacted secret or a blocked word: not the channel's
  text, not its logprob tokens joined in order, not their `bytes`, not an alternative;
- each channel's released text is exactly the redacted text (nothing lost, nothing invented);
- the logprob entries that go out are exactly the ones whose characters went out, in order, each
  rewritten only where its characters were redacted;
- a block in any channel ends the stream with `content_filter` and an explicit error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gateway.safety.config import SafetyConfig
from gateway.safety.guard import SafetyGuard
from gateway.safety.policy import BlocklistRule, SafetyPolicy
from gateway.safety.rules import BlocklistEntry, compile_words, redact, scan
from protocol.chunk import Chunk, Completion, StreamFailed, chunk_from, completion_from, to_builtins

SECRET = "sk-ant-A1b2C3d4E5f6G7h8I9j0K1l2"
WORD = "falcon"
WORDS = (" the", " key", " is", " here", " and", " more", " text", " follows", ".", ",", " ok")
CHANNELS = ("content", "refusal", "reasoning_content", "tool")
POLICY = SafetyPolicy(
    rules={"anthropic_key": "redact"},
    blocklist=(BlocklistRule(BlocklistEntry("blocklist[0]", compile_words([WORD])), "block"),),
    hold_back_chars=96,
)


def _guard() -> Any:
    return SafetyGuard(SafetyConfig(), CollectorRegistry()).begin("req_1", "t", POLICY)


@st.composite
def channel_texts(draw: st.DrawFn, plant: str) -> dict[str, list[str]]:
    """Per channel, its text as a list of tokens; `plant` is put into one channel."""
    chosen = draw(st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=4, unique=True))
    where = draw(st.sampled_from(chosen))
    out: dict[str, list[str]] = {}
    for channel in chosen:
        text = "".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=20)))
        if channel == where and plant:
            at = draw(st.integers(0, len(text)))
            text = text[:at] + plant + text[at:]
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=30))))
        out[channel] = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if text[a:b]]
    return out


def _entry(token: str, alternatives: tuple[str, ...]) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": -0.5,
        "bytes": list(token.encode()),
        "top_logprobs": [
            {"token": token, "logprob": -0.5},
            *({"token": a, "logprob": -4.0} for a in alternatives),
        ],
    }


def _chunks(texts: dict[str, list[str]], group: int, alternatives: tuple[str, ...]) -> list[dict[str, Any]]:
    """The stream: `group` tokens of every channel per chunk, logprobs on content and refusal."""
    chunks = [
        {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    ]
    longest = max(len(tokens) for tokens in texts.values())
    for at in range(0, longest, group):
        delta: dict[str, Any] = {}
        logprobs: dict[str, Any] = {}
        for channel, tokens in texts.items():
            part = tokens[at : at + group]
            if not part:
                continue
            piece = "".join(part)
            if channel == "tool":
                delta["tool_calls"] = [{"index": 0, "function": {"arguments": piece}}]
                if at == 0:
                    delta["tool_calls"][0].update(id="call_1", type="function")
                    delta["tool_calls"][0]["function"]["name"] = "lookup"
            else:
                delta[channel] = piece
            if channel in ("content", "refusal"):
                logprobs[channel] = [_entry(token, alternatives) for token in part]
        chunks.append(
            {
                "id": "c",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs or None}],
            }
        )
    chunks.append(
        {
            "id": "c",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    return chunks


async def _streamed(chunks: list[dict[str, Any]]) -> list[Chunk | StreamFailed]:
    async def items() -> AsyncGenerator[Chunk | StreamFailed, None]:
        for chunk in chunks:
            yield chunk_from(chunk)

    return [item async for item in _guard().guard_stream("chat", items())]


def _received(items: list[Chunk | StreamFailed]) -> dict[str, Any]:
    """Per channel: the text, the logprob tokens in order; and every string anywhere."""
    out: dict[str, Any] = {c: "" for c in CHANNELS} | {
        "tokens:content": [],
        "tokens:refusal": [],
        "strings": [],
    }
    for item in items:
        if isinstance(item, StreamFailed):
            continue
        for choice in item.choices:
            body = choice.body
            assert body is not None
            for channel in ("content", "refusal", "reasoning_content"):
                value = getattr(body, channel)
                if isinstance(value, str):
                    out[channel] += value
            for call in body.tool_calls or ():
                if call.function is not msgspec.UNSET and isinstance(call.function.arguments, str):
                    out["tool"] += call.function.arguments
            if choice.logprobs is not None:
                for channel in ("content", "refusal"):
                    entries = getattr(choice.logprobs, channel)
                    if isinstance(entries, list):
                        out[f"tokens:{channel}"] += [e.token for e in entries]
                        for e in entries:
                            if isinstance(e.bytes, list):
                                out["strings"].append(bytes(e.bytes).decode("utf-8", "replace"))
                            for alt in e.top_logprobs or ():
                                out["strings"].append(alt.token)
        out["strings"].append(msgspec.json.encode(to_builtins(item)).decode())
    return out


def _redacted(text: str) -> str:
    return redact(text, scan(text, ("anthropic_key",)))


@settings(max_examples=300, deadline=None)
@given(texts=channel_texts(f" {SECRET} "), group=st.integers(1, 5))
def test_a_redacted_secret_is_in_no_field_and_every_channel_keeps_its_text(
    texts: dict[str, list[str]], group: int
) -> None:
    items = asyncio.run(_streamed(_chunks(texts, group, alternatives=(SECRET, f" {SECRET}"))))
    assert not any(isinstance(item, StreamFailed) for item in items)
    got = _received(items)
    for channel, tokens in texts.items():
        assert got[channel] == _redacted("".join(tokens)), channel
    for channel in ("content", "refusal"):
        joined = "".join(got[f"tokens:{channel}"])
        assert SECRET not in joined
        if channel in texts:
            # Entries go out with their characters: as many as were sent, the redacted ones rewritten.
            assert len(got[f"tokens:{channel}"]) == len(texts[channel])
            assert joined == _redacted("".join(texts[channel]))
    assert not any(SECRET in s for s in got["strings"])


@settings(max_examples=300, deadline=None)
@given(texts=channel_texts(f" {WORD} "), group=st.integers(1, 5))
def test_a_blocked_word_in_any_channel_stops_the_stream_and_is_in_no_field(
    texts: dict[str, list[str]], group: int
) -> None:
    items = asyncio.run(_streamed(_chunks(texts, group, alternatives=(f" {WORD}",))))
    assert isinstance(items[-1], StreamFailed) and items[-1].code == "content_policy_violation"
    finishes = [c.finish_reason for i in items if isinstance(i, Chunk) for c in i.choices if c.finish_reason]
    assert finishes == ["content_filter"]
    got = _received(items)
    assert not any(WORD in s.lower() for s in got["strings"])


@settings(max_examples=200, deadline=None)
@given(texts=channel_texts(f" {SECRET} "))
def test_a_whole_answer_is_checked_in_every_field_alike(texts: dict[str, list[str]]) -> None:
    message: dict[str, Any] = {"role": "assistant"}
    logprobs: dict[str, Any] = {}
    for channel, tokens in texts.items():
        if channel == "tool":
            message["tool_calls"] = [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "".join(tokens)}}
            ]
        else:
            message[channel] = "".join(tokens)
        if channel in ("content", "refusal"):
            logprobs[channel] = [_entry(t, (SECRET,)) for t in tokens]
    answer = completion_from(
        {
            "id": "c",
            "choices": [
                {"index": 0, "message": message, "logprobs": logprobs or None, "finish_reason": "stop"}
            ],
        }
    )
    checked: Completion = asyncio.run(_guard().check_output(answer))
    wire = msgspec.json.encode(checked).decode()
    assert SECRET not in wire
    body = checked.choices[0].body
    assert body is not None
    for channel, tokens in texts.items():
        value = body.tool_calls[0].function.arguments if channel == "tool" else getattr(body, channel)  # type: ignore[index,union-attr]
        assert value == _redacted("".join(tokens))
        if channel in ("content", "refusal"):
            entries = getattr(checked.choices[0].logprobs, channel)
            assert "".join(e.token for e in entries) == _redacted("".join(tokens))

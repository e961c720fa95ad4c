"""Collecting a stream loses nothing: the cascade streams a non-streamed `model: auto` request from
the small model and collects the chunks back into one answer (gateway/call/collect.py). Whatever
the answer and however the upstream chunked it (choices interleaved, text and tool arguments cut
anywhere, logprobs and token ids riding with their tokens), the collected answer is the one the
upstream would have given whole: every channel, logprob, tool call, finish reason and matched stop
(vLLM's `stop_reason`, which /v1/messages answers as `stop_sequence`)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.call.collect import collect
from protocol.chunk import (
    Choice,
    Chunk,
    Completion,
    FunctionCall,
    Logprobs,
    Message,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    Usage,
    to_builtins,
)

TOKENS = st.lists(st.text(min_size=1, max_size=4), max_size=8)
SOME_TEXT = st.none() | st.text(max_size=12)
STOPS = st.sampled_from([None, "\n\n", "END", 2])


def _cuts(draw: st.DrawFn, size: int) -> list[tuple[int, int]]:
    """[start, end) pieces covering range(size) (empty pieces allowed, at least one piece)."""
    points = sorted(draw(st.lists(st.integers(0, size), max_size=4)))
    edges = [0, *points, size]
    return list(pairwise(edges))


def _pieces(draw: st.DrawFn, text: str) -> list[str]:
    return [text[a:b] for a, b in _cuts(draw, len(text))]


def _chat_logprob(token: str, logprob: float) -> TokenLogprob:
    return TokenLogprob(
        token=token,
        logprob=logprob,
        bytes=list(token.encode()),
        top_logprobs=[TopLogprob(token=token, logprob=logprob, bytes=list(token.encode()))],
    )


@st.composite
def chat_choice(draw: st.DrawFn, index: int) -> tuple[Choice, list[Choice]]:
    """A whole chat choice and the deltas an upstream streams it as, in order."""
    tokens = draw(TOKENS)
    with_content = bool(tokens) or draw(st.booleans())
    with_logprobs = bool(tokens) and draw(st.booleans())
    logprobs = [-float(i) for i in range(len(tokens))]
    token_ids = draw(st.none() | st.just(list(range(len(tokens))))) if with_content else None
    refusal, reasoning = draw(SOME_TEXT), draw(SOME_TEXT)
    calls = [
        (f"call_{i}", draw(st.text(min_size=1, max_size=5)), draw(st.text(max_size=10)))
        for i in range(draw(st.integers(0, 2)))
    ]
    finish, stop = draw(st.sampled_from(["stop", "length", "tool_calls"])), draw(STOPS)

    whole = Choice(
        index=index,
        message=Message(
            role="assistant",
            content="".join(tokens) if with_content else None,
            refusal=refusal if refusal is not None else None,
            reasoning_content=reasoning if reasoning is not None else None,
            tool_calls=[
                ToolCall(id=call_id, type="function", function=FunctionCall(name=name, arguments=arguments))
                for call_id, name, arguments in calls
            ]
            or None,
        ),
        logprobs=Logprobs(content=[_chat_logprob(t, lp) for t, lp in zip(tokens, logprobs, strict=True)])
        if with_logprobs
        else None,
        finish_reason=finish,
        stop_reason=stop,
        token_ids=token_ids,
    )

    deltas = [Choice(index=index, delta=Message(role="assistant", content="" if with_content else None))]
    for a, b in _cuts(draw, len(tokens)) if with_content else ():
        deltas.append(
            Choice(
                index=index,
                delta=Message(content="".join(tokens[a:b])),
                logprobs=Logprobs(
                    content=[_chat_logprob(t, lp) for t, lp in zip(tokens[a:b], logprobs[a:b], strict=True)]
                )
                if with_logprobs
                else None,
                token_ids=token_ids[a:b] if token_ids is not None else None,
            )
        )
    for name, text in (("refusal", refusal), ("reasoning_content", reasoning)):
        if text is not None:
            deltas += [Choice(index=index, delta=Message(**{name: piece})) for piece in _pieces(draw, text)]
    for position, (call_id, name, arguments) in enumerate(calls):
        first, *rest = _pieces(draw, arguments)
        fragments = [
            ToolCall(
                index=position, id=call_id, type="function", function=FunctionCall(name=name, arguments=first)
            )
        ]
        fragments += [ToolCall(index=position, function=FunctionCall(arguments=piece)) for piece in rest]
        deltas += [Choice(index=index, delta=Message(tool_calls=[fragment])) for fragment in fragments]
    deltas.append(Choice(index=index, delta=Message(), finish_reason=finish, stop_reason=stop))
    return whole, deltas


@st.composite
def completion_choice(draw: st.DrawFn, index: int) -> tuple[Choice, list[Choice]]:
    """A whole completions choice and its streamed pieces (text with its parallel logprob lists)."""
    tokens = draw(TOKENS)
    with_logprobs = draw(st.booleans())
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]

    def logprobs(a: int, b: int) -> Logprobs | None:
        if not with_logprobs:
            return None
        return Logprobs(
            tokens=tokens[a:b],
            token_logprobs=[-float(i) for i in range(a, b)],
            top_logprobs=[{t: -float(i)} for i, t in enumerate(tokens[a:b], a)],
            text_offset=offsets[a:b],
        )

    token_ids = draw(st.none() | st.just(list(range(len(tokens)))))
    finish, stop = draw(st.sampled_from(["stop", "length"])), draw(STOPS)
    whole = Choice(
        index=index,
        text="".join(tokens),
        logprobs=logprobs(0, len(tokens)) if tokens else None,
        finish_reason=finish,
        stop_reason=stop,
        token_ids=token_ids,
    )
    pieces = [
        Choice(
            index=index,
            text="".join(tokens[a:b]),
            logprobs=logprobs(a, b) if b > a else None,
            token_ids=token_ids[a:b] if token_ids is not None else None,
        )
        for a, b in _cuts(draw, len(tokens))
    ]
    pieces.append(Choice(index=index, text="", finish_reason=finish, stop_reason=stop))
    return whole, pieces


@st.composite
def streamed_answers(draw: st.DrawFn) -> tuple[str, Completion, list[Chunk], Usage]:
    endpoint = draw(st.sampled_from(["chat", "completions"]))
    make = chat_choice if endpoint == "chat" else completion_choice
    drawn = [draw(make(i)) for i in range(draw(st.integers(1, 3)))]
    fingerprint = draw(st.sampled_from([None, "fp_1"]))
    usage = Usage(prompt_tokens=3, completion_tokens=5, total_tokens=8)
    header: dict[str, Any] = {"id": "x-1", "created": 7, "model": "small", "system_fingerprint": fingerprint}
    whole = Completion(
        object="chat.completion" if endpoint == "chat" else "text_completion",
        choices=[choice for choice, _ in drawn],
        usage=usage,
        **header,
    )
    # The upstream interleaves the choices' pieces in any order, each choice's in its own order.
    queues = [list(pieces) for _, pieces in drawn]
    chunks = []
    while any(queues):
        waiting = [q for q in queues if q]
        queue = waiting[draw(st.integers(0, len(waiting) - 1))]
        chunks.append(Chunk(choices=[queue.pop(0)], **header))
    return endpoint, whole, chunks, usage


def _meaning(value: Any) -> Any:
    """The JSON with null-valued keys left out: an absent field and a null one say the same."""
    if isinstance(value, dict):
        return {k: _meaning(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_meaning(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(streamed_answers())
def test_a_collected_stream_is_the_whole_answer(case: tuple[str, Completion, list[Chunk], Usage]) -> None:
    endpoint, whole, chunks, usage = case
    collected = collect(endpoint, chunks, usage)
    assert _meaning(to_builtins(collected)) == _meaning(to_builtins(whole))


def test_a_matched_stop_string_survives_collection() -> None:
    """The case a client saw: `model: auto` + `stop_sequences` on /v1/messages answered end_turn."""
    header: dict[str, Any] = {"id": "x", "created": 1, "model": "small"}
    chunks = [
        Chunk(choices=[Choice(delta=Message(role="assistant", content="Hi"))], **header),
        Chunk(choices=[Choice(delta=Message(), finish_reason="stop", stop_reason="END")], **header),
    ]
    [choice] = collect("chat", chunks, None).choices
    assert (choice.finish_reason, choice.stop_reason) == ("stop", "END")

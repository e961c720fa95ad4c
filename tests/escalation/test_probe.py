"""The cascade's hold-back: `probe` reads no further than K tokens, `release` gives back exactly
what was held and then the rest, and a break during the probe reaches the relay unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import msgspec
import pytest

from gateway.call.collect import collect
from gateway.escalation.cascade import probe, release
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import OpenedStream
from protocol.chunk import Chunk, Usage, chunk_from
from router.types import Target
from tests.support.chunks import as_wire


def chat_chunk(token: int, logprob: float, finish: str | None = None) -> Chunk:
    return chunk_from(
        {
            "id": "c1",
            "created": 1,
            "model": "small",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": f"t{token} "},
                    "token_ids": [token],
                    "logprobs": {"content": [{"token": f"t{token}", "logprob": logprob}]},
                    "finish_reason": finish,
                }
            ],
        }
    )


class Upstream:
    """A stream whose first chunk has come; it yields up to chunk `ready`, then waits for `more`
    before yielding the rest (or raising `error` there). `taken` counts the chunks handed out."""

    def __init__(self, chunks: list[Chunk], ready: int, error: UpstreamError | None = None) -> None:
        self.chunks, self.ready, self.error = chunks, ready, error
        self.taken = 1  # the first chunk, which opened the stream
        self.more = asyncio.Event()

    async def _rest(self) -> AsyncIterator[Chunk]:
        for i in range(1, len(self.chunks)):
            if i == self.ready:
                await self.more.wait()
                if self.error is not None:
                    raise self.error
            self.taken += 1
            yield self.chunks[i]

    def opened(self) -> OpenedStream:
        target = Target(
            kind="node",
            target_id="n1",
            url="http://n1",
            region="eu-west",
            jurisdiction="eu",
            model="small",
            reason="-",
        )
        return OpenedStream(
            target=target, attempts=1, chunks=self._rest(), first=self.chunks[0], stack=AsyncExitStack()
        )


async def test_the_probe_stops_at_k_tokens_and_release_replays_them_first() -> None:
    chunks = [chat_chunk(i, -0.5) for i in range(10)] + [chat_chunk(10, -0.5, "length")]
    upstream = Upstream(chunks, ready=4)
    opened = upstream.opened()
    # K = 4: the probe returns while the upstream holds its 5th chunk back; it never asked for it.
    found = await asyncio.wait_for(probe(opened, 4), timeout=5)
    assert found.tokens == 4 and found.logprobs == [-0.5] * 4 and not found.finished
    assert upstream.taken == 4 and found.judgeable

    released = release(opened, found)
    assert released.first is chunks[0]
    upstream.more.set()
    rest = [chunk async for chunk in released.chunks]
    assert [released.first, *rest] == chunks


async def test_an_answer_shorter_than_k_is_judged_on_what_came() -> None:
    chunks = [chat_chunk(0, -0.1), chat_chunk(1, -0.2, "stop")]
    found = await probe(Upstream(chunks, ready=5).opened(), 8)
    assert found.finished and found.tokens == 2 and found.logprobs == [-0.1, -0.2]


async def test_a_break_during_the_probe_reaches_the_relay_after_the_held_chunks() -> None:
    chunks = [chat_chunk(i, -0.5) for i in range(6)]
    error = UpstreamError("node went away", status_code=502)
    upstream = Upstream(chunks, ready=2, error=error)
    upstream.more.set()
    opened = upstream.opened()
    found = await probe(opened, 4)
    assert found.error is error and not found.judgeable and found.tokens == 2
    released = release(opened, found)
    got = []
    with pytest.raises(UpstreamError):
        async for chunk in released.chunks:
            got.append(chunk)
    assert [released.first, *got] == chunks[:2]


async def test_an_upstream_without_logprobs_cannot_be_judged() -> None:
    chunks = [chat_chunk(i, -0.5) for i in range(5)]
    for chunk in chunks:
        chunk.choices[0].logprobs = None
    found = await probe(Upstream(chunks, ready=5).opened(), 3)
    assert found.tokens == 3 and not found.judgeable


def test_collect_rebuilds_the_non_streamed_response() -> None:
    chunks = [
        {"id": "c1", "created": 7, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        *[chat_chunk(i, -0.25) for i in range(3)],
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "f", "arguments": '{"a"'},
                            }
                        ]
                    },
                }
            ],
        },
        {
            "id": "c1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                    "finish_reason": "tool_calls",
                }
            ],
        },
    ]
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    response = as_wire(collect("chat", [chunk_from(c) for c in chunks], msgspec.convert(usage, Usage)))
    assert response["object"] == "chat.completion" and response["id"] == "c1" and response["created"] == 7
    [choice] = response["choices"]
    assert choice["message"]["content"] == "t0 t1 t2 "
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    assert choice["token_ids"] == [0, 1, 2] and len(choice["logprobs"]["content"]) == 3
    assert choice["finish_reason"] == "tool_calls" and response["usage"] == usage

    text = as_wire(
        collect(
            "completions",
            [
                chunk_from({"id": "x", "choices": [{"index": 0, "text": "ab"}]}),
                chunk_from({"choices": [{"index": 0, "text": "c", "finish_reason": "stop"}]}),
            ],
            None,
        )
    )
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "abc"
    assert text["choices"][0]["logprobs"] is None and "usage" not in text

"""Many streams at once: continuous batching must not change what any request gets."""

from __future__ import annotations

import asyncio

from tests.node.conftest import CHAT_MODEL, Node

CONCURRENCY = 32
MAX_TOKENS = 12


def _messages(index: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Request number {index}: describe item {index * 7 % 13}."}]


async def _stream_text(client, index: int) -> str:  # type: ignore[no-untyped-def]
    stream = await client.chat.completions.create(
        model=CHAT_MODEL,
        messages=_messages(index),
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    parts = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    return "".join(parts)


async def test_32_concurrent_greedy_streams_equal_their_solo_runs(node: Node) -> None:
    async with node.async_client() as client:
        together = await asyncio.gather(*(_stream_text(client, i) for i in range(CONCURRENCY)))
        alone = []
        for i in range(CONCURRENCY):
            reply = await client.chat.completions.create(
                model=CHAT_MODEL,
                messages=_messages(i),
                max_tokens=MAX_TOKENS,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            alone.append(reply.choices[0].message.content)
    assert together == alone
    assert node.load()["num_running"] == 0

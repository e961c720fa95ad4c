"""continuation_token_ids: a stream broken after any chunk continues exactly, on this node or any.

The client's chunks so far plus the continuation's chunks give the unbroken stream's text, token
ids, finish_reason and stop_reason, also where the node held text back (the start of a possible stop string,
half a UTF-8 character) and where the break came after the last token's chunk but before the
finish chunk.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from tests.node.conftest import CHAT_MODEL

TOTAL = 14
K = 5
STORY = "Tell a story"
# This model's text for STORY is full of "s", "h" and U+FFFD (bytes that are no character), so
# text is held back at many chunk boundaries; the snowmen never come, so these never match.
NEVER_MATCHING = ["s☃☃", "h☃☃", "\ufffd☃"]


@dataclass
class Streamed:
    chunks: list[tuple[list[int], str]] = field(default_factory=list)  # (token ids, text)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    usage: Any = None

    @property
    def token_ids(self) -> list[int]:
        return [t for ids, _ in self.chunks for t in ids]

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.chunks)


def stream_completion(client: openai.OpenAI, max_tokens: int, **extra: Any) -> Streamed:
    out = Streamed()
    for chunk in client.completions.create(
        model=CHAT_MODEL,
        prompt=STORY,
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, **extra},
    ):
        if chunk.usage is not None:
            out.usage = chunk.usage
        for choice in chunk.choices:
            ids = (choice.model_extra or {}).get("token_ids") or []
            if ids or choice.text:
                out.chunks.append((ids, choice.text))
            out.finish_reason = choice.finish_reason or out.finish_reason
            if choice.finish_reason:
                out.stop_reason = (choice.model_extra or {})["stop_reason"]
    return out


def test_completion_continued_from_first_k_tokens_gives_the_rest(client: openai.OpenAI) -> None:
    args = {"model": CHAT_MODEL, "prompt": "Far across the sea", "temperature": 0}
    full = client.completions.create(
        **args, max_tokens=TOTAL, extra_body={"return_token_ids": True, "ignore_eos": True}
    )
    ids = full.choices[0].model_extra["token_ids"]
    assert len(ids) == TOTAL
    rest = client.completions.create(
        **args,
        max_tokens=TOTAL - K,
        extra_body={"return_token_ids": True, "ignore_eos": True, "continuation_token_ids": ids[:K]},
    )
    assert rest.choices[0].model_extra["token_ids"] == ids[K:]
    # Continued tokens count as prompt tokens.
    assert rest.usage.prompt_tokens == full.usage.prompt_tokens + K


def test_streamed_chat_continued_from_first_k_tokens_gives_the_rest(client: openai.OpenAI) -> None:
    args = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Tell a story"}], "temperature": 0}
    extra = {"return_token_ids": True, "ignore_eos": True}
    chunks = list(client.chat.completions.create(**args, max_tokens=TOTAL, stream=True, extra_body=extra))
    ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert len(ids) == TOTAL
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    rest = client.chat.completions.create(
        **args, max_tokens=TOTAL - K, extra_body={**extra, "continuation_token_ids": ids[:K]}
    )
    assert rest.choices[0].model_extra["token_ids"] == ids[K:]
    assert text.endswith(rest.choices[0].message.content)


def story_text(client: openai.OpenAI) -> str:
    return stream_completion(client, 30, ignore_eos=True).text


@pytest.mark.parametrize("stop_kind", ["never-matching stops", "a stop that matches"])
def test_a_stream_broken_after_any_chunk_continues_exactly(client: openai.OpenAI, stop_kind: str) -> None:
    text = story_text(client)
    stops = list(NEVER_MATCHING)
    if stop_kind == "a stop that matches":
        stops.append(text[len(text) // 2 : len(text) // 2 + 3])
    extra = {"stop": stops, "ignore_eos": True}
    whole = stream_completion(client, 30, **extra)
    if stop_kind == "never-matching stops":
        assert (whole.finish_reason, whole.stop_reason) == ("length", None)
    else:
        assert (whole.finish_reason, whole.stop_reason) == ("stop", stops[-1])
    assert any(not text for _, text in whole.chunks), "text was held back at some chunk"

    def continued(k: int) -> Streamed:
        carried = [t for ids, _ in whole.chunks[:k] for t in ids]
        return stream_completion(client, 30 - len(carried), continuation_token_ids=carried, **extra)

    n = len(whole.chunks)
    with ThreadPoolExecutor(4) as pool:
        rests = list(pool.map(continued, range(1, n + 1)))
    for k, rest in enumerate(rests, start=1):
        received = Streamed(whole.chunks[:k])
        assert (
            received.text + rest.text,
            received.token_ids + rest.token_ids,
            rest.finish_reason,
            rest.stop_reason,
        ) == (whole.text, whole.token_ids, whole.finish_reason, whole.stop_reason), (
            f"broken after chunk {k} of {n}"
        )
    # Broken after the last token's chunk: the continuation only closes the stream.
    assert (rests[-1].chunks, rests[-1].usage.completion_tokens) == ([], 0)
    assert rests[-1].usage.prompt_tokens == whole.usage.prompt_tokens + len(whole.token_ids)


def test_a_carried_stop_token_closes_the_stream_at_once(client: openai.OpenAI) -> None:
    ids = stream_completion(client, 30, ignore_eos=True).token_ids
    stop_token = ids[10]
    whole = stream_completion(client, 30, ignore_eos=True, stop_token_ids=[stop_token])
    assert whole.finish_reason == "stop" and whole.token_ids == ids[: ids.index(stop_token) + 1]
    assert whole.stop_reason == stop_token
    rest = stream_completion(
        client,
        30 - len(whole.token_ids),
        ignore_eos=True,
        stop_token_ids=[stop_token],
        continuation_token_ids=whole.token_ids,
    )
    assert (rest.chunks, rest.finish_reason, rest.stop_reason, rest.usage.completion_tokens) == (
        [],
        "stop",
        stop_token,
        0,
    )


def test_max_tokens_zero_is_only_for_continuations(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        stream_completion(client, 0)

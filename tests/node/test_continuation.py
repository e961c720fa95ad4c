"""continuation_token_ids: a stream broken after k tokens continues token-exactly elsewhere."""

from __future__ import annotations

import openai

from tests.node.conftest import CHAT_MODEL

TOTAL = 14
K = 5


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

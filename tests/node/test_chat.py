"""Chat completions through the official OpenAI SDK against a real node process."""

from __future__ import annotations

import openai

from tests.node.conftest import CHAT_MODEL

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the river and the mountain."},
]


def test_chat_returns_openai_shape_with_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=CHAT_MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == CHAT_MODEL
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 0
    assert 1 <= usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens >= 0


def test_max_completion_tokens_limits_output(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=MESSAGES,
        max_completion_tokens=3,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage.completion_tokens == 3
    assert reply.choices[0].finish_reason == "length"
    extra = reply.choices[0].model_extra
    assert "stop_reason" in extra and extra["stop_reason"] is None, "present, and null (as vLLM)"


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "A long shared prefix " * 8}]
    client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_streaming_chat_sends_role_content_finish_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert [c.choices[0].finish_reason for c in finishing] == ["length"]
    extra = finishing[0].choices[0].model_extra
    assert "stop_reason" in extra and extra["stop_reason"] is None
    # Only the finishing chunk says how it stopped (vLLM's chat chunks leave it out otherwise).
    assert [c for c in chunks if c.choices and "stop_reason" in c.choices[0].model_extra] == finishing
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 6
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model=CHAT_MODEL, messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert streamed == whole.choices[0].message.content


def test_streaming_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, max_tokens=3, temperature=0, stream=True
        )
    )
    assert all(chunk.choices for chunk in chunks)
    assert all(chunk.usage is None for chunk in chunks)


def test_stop_string_ends_text_before_it(client: openai.OpenAI) -> None:
    args = {"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    full = client.chat.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].message.content
    assert len(full) > 8, full
    stop = full[4:7]
    expected = full[: full.index(stop)]
    stopped = client.chat.completions.create(**args, stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.model_extra["stop_reason"] == stop
    assert stopped.message.content == expected
    single = client.chat.completions.create(**args, stop=stop, extra_body={"ignore_eos": True}).choices[0]
    assert single.message.content == expected
    assert single.model_extra["stop_reason"] == stop


def test_streamed_stop_string_is_the_finish_chunks_stop_reason(client: openai.OpenAI) -> None:
    args = {"model": CHAT_MODEL, "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    full = client.chat.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].message.content
    assert len(full) > 12, full
    stop = full[9:12]
    chunks = list(
        client.chat.completions.create(
            **args, stop=["never ☃", stop], stream=True, extra_body={"ignore_eos": True}
        )
    )
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert [(c.finish_reason, c.model_extra["stop_reason"]) for c in finishing] == [("stop", stop)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full[: full.index(stop)]


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        reply = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            extra_body={"ignore_eos": True},
        )
        return reply.choices[0].message.content

    assert sample(1234) == sample(1234)
    assert len({sample(seed) for seed in (1, 2, 3, 4)}) > 1


def test_logprobs_cover_every_token(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == 5
    assert all(entry.logprob <= 0.0 for entry in content)
    # Special tokens are listed but add no text; a token may hold half a multi-byte character.
    joined = "".join(e.token for e in content if not (e.token.startswith("<|") and e.token.endswith("|>")))
    if "\ufffd" not in joined:
        assert joined == reply.choices[0].message.content
    for entry in content:
        # The 3 most likely tokens, most likely first: greedy, the first is the one chosen.
        alternatives = entry.top_logprobs
        assert len(alternatives) == 3
        assert alternatives[0].token == entry.token and alternatives[0].logprob == entry.logprob
        values = [a.logprob for a in alternatives]
        assert values == sorted(values, reverse=True)
        assert all(a.bytes == list(a.token.encode()) for a in alternatives)


def test_streamed_logprobs_arrive_with_their_chunks(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            max_tokens=4,
            temperature=0,
            logprobs=True,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    entries = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert len(entries) == 4


def test_text_content_parts_and_developer_role_are_accepted(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        max_tokens=4,
        temperature=0,
    )
    parts = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        ],
        max_tokens=4,
        temperature=0,
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content


def test_multi_turn_with_assistant_message(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again?"},
        ],
        max_tokens=3,
        user="someone",
    )
    assert reply.usage.completion_tokens >= 1


def test_continue_final_message_extends_the_assistant_turn(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon"}],
        max_tokens=3,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_return_token_ids_match_completion_tokens(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    token_ids = reply.choices[0].model_extra["token_ids"]
    assert len(token_ids) == reply.usage.completion_tokens == 5


def test_chat_without_max_tokens_on_a_small_pool_fits_the_pool(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Hi"}], temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")

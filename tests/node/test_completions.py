"""Legacy completions through the official OpenAI SDK against a real node process."""

from __future__ import annotations

import openai
import pytest

from tests.node.conftest import CHAT_MODEL

PROMPT = "The old lighthouse keeper"


def test_text_prompt_returns_text_completion(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=CHAT_MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    assert reply.object == "text_completion"
    assert reply.id.startswith("cmpl-")
    assert isinstance(reply.choices[0].text, str)
    assert reply.usage.prompt_tokens > 0 and 1 <= reply.usage.completion_tokens <= 6
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_default_max_tokens_is_sixteen(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=CHAT_MODEL, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 16


def test_prompt_forms_agree(client: openai.OpenAI) -> None:
    args = {"model": CHAT_MODEL, "max_tokens": 5, "temperature": 0, "extra_body": {"return_token_ids": True}}
    as_text = client.completions.create(prompt=PROMPT, **args)
    as_list = client.completions.create(prompt=[PROMPT], **args)
    assert as_list.choices[0].text == as_text.choices[0].text
    ids = client.completions.create(prompt=[1, 2, 3, 4], **args)
    nested = client.completions.create(prompt=[[1, 2, 3, 4]], **args)
    assert ids.usage.prompt_tokens == 4
    assert nested.choices[0].model_extra["token_ids"] == ids.choices[0].model_extra["token_ids"]


def test_empty_prompt_is_accepted(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=CHAT_MODEL, prompt="", max_tokens=2)
    assert reply.usage.prompt_tokens >= 1


def test_logprobs_give_tokens_and_token_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=CHAT_MODEL,
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert all(value <= 0.0 for value in logprobs.token_logprobs)
    assert logprobs.text_offset[0] == 0
    for token, value, alternatives in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        # Up to 3 (two tokens that decode alike share a key), greedy: the chosen one the likeliest.
        assert 1 <= len(alternatives) <= 3
        assert alternatives[token] == value == max(alternatives.values())


def test_streaming_completion_matches_non_streaming(client: openai.OpenAI) -> None:
    args = {
        "model": CHAT_MODEL,
        "prompt": PROMPT,
        "max_tokens": 7,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    assert chunks[-1].usage.completion_tokens == 7
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishing[0].model_extra["stop_reason"] is None and "stop_reason" in finishing[0].model_extra
    assert (
        whole.choices[0].model_extra["stop_reason"] is None and "stop_reason" in whole.choices[0].model_extra
    )


def test_stop_token_ids_end_generation(client: openai.OpenAI) -> None:
    args = {"model": CHAT_MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
    first = client.completions.create(**args, extra_body={"return_token_ids": True, "ignore_eos": True})
    ids = first.choices[0].model_extra["token_ids"]
    stopper = ids[3]
    stopped = client.completions.create(
        **args, extra_body={"stop_token_ids": [stopper], "return_token_ids": True, "ignore_eos": True}
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].model_extra["stop_reason"] == stopper
    assert stopped.choices[0].model_extra["token_ids"] == ids[: ids.index(stopper) + 1]


def test_stop_string_is_reported_as_stop_reason_whole_and_streamed(client: openai.OpenAI) -> None:
    args = {"model": CHAT_MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    full = client.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].text
    assert len(full) > 10, full
    stop = full[6:10]
    expected = full[: full.index(stop)]
    stopped = client.completions.create(**args, stop=[stop, "never ☃"], extra_body={"ignore_eos": True})
    choice = stopped.choices[0]
    assert (choice.finish_reason, choice.model_extra["stop_reason"], choice.text) == ("stop", stop, expected)
    chunks = list(
        client.completions.create(**args, stop=[stop], stream=True, extra_body={"ignore_eos": True})
    )
    finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [(c.finish_reason, c.model_extra["stop_reason"]) for c in finishing] == [("stop", stop)]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected


def test_models_list_names_every_served_model(client: openai.OpenAI) -> None:
    names = {model.id for model in client.models.list()}
    assert names == {"tiny", "tiny-llama"}


def test_models_retrieve_answers_for_a_served_model(client: openai.OpenAI) -> None:
    model = client.models.retrieve("tiny")
    assert (model.id, model.object) == ("tiny", "model")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17")

"""Every bad input gets an OpenAI-format error with OpenAI's status, and the node keeps serving."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.node.conftest import CHAT_MODEL, SMALL_POOL_MODEL, Node

USER = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": CHAT_MODEL, "messages": USER, "max_tokens": 2, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": CHAT_MODEL, "prompt": "Hi", "max_tokens": 2, **fields}


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# (id, path, json body, status, param, code)
CASES = [
    ("missing_messages", CHAT, {"model": CHAT_MODEL}, 400, "messages", None),
    ("missing_model", CHAT, {"messages": USER}, 400, "model", None),
    ("wrong_type", CHAT, chat(max_tokens="ten"), 400, "max_tokens", None),
    ("wrong_message_type", CHAT, chat(messages="hello"), 400, "messages", None),
    ("empty_messages", CHAT, chat(messages=[]), 400, "messages", None),
    ("unknown_model", CHAT, chat(model="gpt-17"), 404, "model", "model_not_found"),
    ("unknown_model_completions", COMPLETIONS, completion(model="nope"), 404, "model", "model_not_found"),
    ("negative_temperature", CHAT, chat(temperature=-1), 400, "temperature", None),
    ("zero_top_p", CHAT, chat(top_p=0), 400, "top_p", None),
    ("zero_max_tokens", CHAT, chat(max_tokens=0), 400, "max_tokens", None),
    ("n_above_one", CHAT, chat(n=2), 400, "n", None),
    ("presence_penalty", CHAT, chat(presence_penalty=0.5), 400, "presence_penalty", None),
    ("frequency_penalty", COMPLETIONS, completion(frequency_penalty=1.0), 400, "frequency_penalty", None),
    (
        "image_part",
        CHAT,
        chat(
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
        ),
        400,
        "messages[0].content[0].type",
        None,
    ),
    (
        "tool_role",
        CHAT,
        chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}]),
        400,
        "messages[0].role",
        None,
    ),
    (
        # Answered as text, the earlier call would be dropped silently from the conversation.
        "assistant_tool_calls",
        CHAT,
        chat(
            messages=[
                *USER,
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
            ]
        ),
        400,
        "messages[1].tool_calls",
        None,
    ),
    ("best_of_zero", COMPLETIONS, completion(best_of=0), 400, "best_of", None),
    ("echo", COMPLETIONS, completion(echo=True), 400, "echo", None),
    ("suffix", COMPLETIONS, completion(suffix="end"), 400, "suffix", None),
    ("batched_prompts", COMPLETIONS, completion(prompt=["a", "b"]), 400, "prompt", None),
    ("token_outside_vocab", COMPLETIONS, completion(prompt=[1, 10**7]), 400, "prompt", None),
    ("prompt_too_long", COMPLETIONS, completion(prompt=[5] * 5000), 400, "prompt", "context_length_exceeded"),
    (
        "messages_too_long",
        CHAT,
        chat(messages=[{"role": "user", "content": "word " * 5000}]),
        400,
        "messages",
        "context_length_exceeded",
    ),
    (
        "max_tokens_past_context",
        COMPLETIONS,
        completion(max_tokens=5000),
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "too_large_for_kv_pool",
        COMPLETIONS,
        completion(model=SMALL_POOL_MODEL, prompt=[5] * 100, max_tokens=100),
        400,
        "prompt",
        "request_too_large",
    ),
    (
        "continuation_outside_vocab",
        COMPLETIONS,
        completion(continuation_token_ids=[10**7]),
        400,
        "continuation_token_ids",
        None,
    ),
    ("stream_wrong_type", CHAT, chat(stream="yes"), 400, "stream", None),
    ("logit_bias", CHAT, chat(logit_bias={"5": 10}), 400, "logit_bias", None),
    ("json_mode", CHAT, chat(response_format={"type": "json_object"}), 400, "response_format", None),
    ("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools", None),
    ("best_of", COMPLETIONS, completion(best_of=3), 400, "best_of", None),
    ("functions", CHAT, chat(functions=[{"name": "f", "parameters": {}}]), 400, "functions", None),
    ("audio", CHAT, chat(audio={"voice": "alloy", "format": "wav"}), 400, "audio", None),
    ("audio_modality", CHAT, chat(modalities=["text", "audio"]), 400, "modalities", None),
    ("web_search", CHAT, chat(web_search_options={}), 400, "web_search_options", None),
    # vLLM's sampling extensions the engine does not implement: refused, never silently ignored.
    ("min_p", CHAT, chat(min_p=0.2), 400, "min_p", None),
    ("repetition_penalty", COMPLETIONS, completion(repetition_penalty=1.2), 400, "repetition_penalty", None),
    ("guided_json", CHAT, chat(guided_json={"type": "object"}), 400, "guided_json", None),
    ("skip_special_tokens", CHAT, chat(skip_special_tokens=False), 400, "skip_special_tokens", None),
    ("min_p_wrong_type", CHAT, chat(min_p="low"), 400, "min_p", None),
    # A choice that asks for a call needs tools: served as text, it would answer another question.
    ("tool_choice_required", CHAT, chat(tool_choice="required"), 400, "tool_choice", None),
    (
        "tool_choice_named",
        CHAT,
        chat(tool_choice={"type": "function", "function": {"name": "f"}}),
        400,
        "tool_choice",
        None,
    ),
    ("tool_choice_unknown", CHAT, chat(tool_choice="sometimes"), 400, "tool_choice", None),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request_gets_openai_error(
    http: httpx.Client, path: str, body: dict[str, Any], status: int, param: str | None, code: str | None
) -> None:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert "Traceback" not in response.text


def test_text_response_format_and_tools_switched_off_are_served(http: httpx.Client) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = chat(response_format={"type": "text"}, tools=tools, tool_choice="none", logit_bias={})
    assert http.post(CHAT, json=body).status_code == 200
    functions = [{"name": "f", "parameters": {"type": "object"}}]
    body = chat(functions=functions, function_call="none", modalities=["text"])
    assert http.post(CHAT, json=body).status_code == 200
    # vLLM's extensions at their defaults ask for nothing.
    body = chat(min_p=0.0, repetition_penalty=1.0, min_tokens=0, bad_words=[], skip_special_tokens=True)
    assert http.post(CHAT, json=body).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_errors_come_before_a_stream_starts(http: httpx.Client, stream: bool) -> None:
    response = http.post(COMPLETIONS, json=completion(temperature=-2, stream=stream))
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"", b"[1, 2]", b'"text"'],
    ids=["malformed", "empty", "array", "string"],
)
def test_body_that_is_not_a_json_object_is_400(http: httpx.Client, raw: bytes) -> None:
    response = http.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_bad_priority_header_is_400(http: httpx.Client) -> None:
    response = http.post(CHAT, json=chat(), headers={"x-meridian-priority": "urgent"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-meridian-priority"


def test_wrong_method_is_405_in_openai_format(http: httpx.Client) -> None:
    response = http.get(CHAT)
    assert response.status_code == 405
    assert response.json()["error"]["message"]


def test_unknown_path_is_404_in_openai_format(http: httpx.Client) -> None:
    response = http.post("/v1/embeddings", json={"model": CHAT_MODEL, "input": "x"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert "Invalid URL (POST /v1/embeddings)" in error["message"] and error["code"] == "not_found"


def test_node_keeps_serving_after_errors(node: Node, http: httpx.Client) -> None:
    for case in CASES[:5]:
        http.post(case[1], json=case[2])
    response = http.post(CHAT, json=chat(max_tokens=3))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] >= 1
    assert node.load()["num_running"] == 0


def test_number_out_of_range_names_no_bogus_param(http: httpx.Client) -> None:
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "temperature": 1e400}'
    response = http.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] is None

"""`/tokenize` and `/detokenize` (vLLM's shapes) on a real node: a conversation's count is the
`prompt_tokens` its generation reports, whatever the messages, and errors name their field."""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.node.conftest import CHAT_MODEL, SMALL_POOL_MODEL

# Mixed scripts, spaces and newlines: the template and the byte-level BPE both see them.
TEXT = st.text(alphabet=st.sampled_from("ab cdé\n日本語🙂.,!?"), min_size=0, max_size=40)
ROLES = st.sampled_from(["system", "developer", "user", "assistant"])
CONVERSATIONS = st.lists(st.fixed_dictionaries({"role": ROLES, "content": TEXT}), min_size=1, max_size=5)
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _tokenize(http: httpx.Client, body: dict) -> dict:
    response = http.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    return response.json()


# Too long for the small pool (found by the fuzzer): the refusal must name the same count.
_TOO_LONG = [
    {"role": "system", "content": ""},
    {"role": "system", "content": "?" * 26 + "日" * 9},
    {"role": "system", "content": "?" * 27 + "日" * 9},
]


@SETTINGS
@given(messages=CONVERSATIONS, prefill=st.booleans(), model=st.sampled_from([CHAT_MODEL, SMALL_POOL_MODEL]))
@example(messages=_TOO_LONG, prefill=False, model=SMALL_POOL_MODEL)
def test_a_conversations_count_is_the_prompt_tokens_of_its_generation(
    http: httpx.Client, messages: list[dict], prefill: bool, model: str
) -> None:
    if prefill:  # Anthropic's prefill as the gateway sends it: the last assistant turn continued
        messages = [*messages, {"role": "assistant", "content": "Sure"}]
    template = {"continue_final_message": True, "add_generation_prompt": False} if prefill else {}
    counted = _tokenize(http, {"model": model, "messages": messages, **template})
    assert counted["count"] == len(counted["tokens"]) and counted["max_model_len"] > 0
    generated = http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 1, **template},
    )
    error = generated.json().get("error") if generated.status_code == 400 else None
    if error is not None and error["code"] == "request_too_large":
        # The small pool (8 blocks of 16 tokens) cannot hold every conversation: refused in words,
        # naming the tokens whose KV it would store, the prompt alone here (the one token asked
        # for is never fed back).
        assert f"for {counted['count']} tokens" in error["message"], error
        return
    assert generated.status_code == 200, generated.text
    assert counted["count"] == generated.json()["usage"]["prompt_tokens"]


@SETTINGS
@given(prompt=TEXT.filter(bool))
def test_a_prompts_count_is_its_completions_prompt_tokens_and_its_tokens_read_back(
    http: httpx.Client, prompt: str
) -> None:
    counted = _tokenize(http, {"model": CHAT_MODEL, "prompt": prompt})
    generated = http.post("/v1/completions", json={"model": CHAT_MODEL, "prompt": prompt, "max_tokens": 1})
    assert generated.status_code == 200, generated.text
    assert counted["count"] == generated.json()["usage"]["prompt_tokens"]
    plain = _tokenize(http, {"model": CHAT_MODEL, "prompt": prompt, "add_special_tokens": False})
    back = http.post("/detokenize", json={"model": CHAT_MODEL, "tokens": plain["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": prompt}


def test_token_strings_on_request_and_special_tokens_as_asked(http: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hi there"}]
    counted = _tokenize(http, {"model": CHAT_MODEL, "messages": messages, "return_token_strs": True})
    assert len(counted["token_strs"]) == counted["count"] and all(
        isinstance(s, str) for s in counted["token_strs"]
    )
    assert _tokenize(http, {"model": CHAT_MODEL, "prompt": "hi"})["token_strs"] is None
    no_turn = _tokenize(http, {"model": CHAT_MODEL, "messages": messages, "add_generation_prompt": False})
    assert no_turn["count"] < counted["count"], "the assistant turn's opening is counted only when asked"


def test_bad_bodies_are_400s_naming_the_field(http: httpx.Client) -> None:
    cases = [
        ({"model": CHAT_MODEL}, "messages"),
        ({"model": CHAT_MODEL, "prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "messages"),
        ({"model": CHAT_MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"model": CHAT_MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
        ),
        ({"model": CHAT_MODEL, "prompt": 5}, "prompt"),
    ]
    for body, param in cases:
        response = http.post("/tokenize", json=body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"] == param, (body, response.text)
    unknown = http.post("/tokenize", json={"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    for tokens, param in (([1, -1], "tokens[1]"), ([10**9], "tokens[0]")):
        response = http.post("/detokenize", json={"model": CHAT_MODEL, "tokens": tokens})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_tokenize_needs_the_node_credential(node) -> None:  # type: ignore[no-untyped-def]
    response = httpx.post(f"{node.url}/tokenize", json={"model": CHAT_MODEL, "prompt": "x"}, timeout=10)
    assert response.status_code == 401

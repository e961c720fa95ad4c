"""The Responses door's parser (gateway/responses/translate.py) refuses every body it cannot
serve with an InvalidRequestError naming the field, whatever JSON each field holds, at any depth
of `input` (messages, function calls and their outputs) and `tools`: never another exception (a
500); what it accepts translates to a chat request. schemathesis found a content part whose `type` was an
object: the set lookup raised TypeError."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.responses.translate import chat_request, parse_request
from protocol import ChatCompletionRequest, InvalidRequestError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _or_any(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return strategy | json_values


parts = st.fixed_dictionaries(
    {"type": _or_any(st.sampled_from(["input_text", "output_text", "input_image"]))},
    optional={"text": _or_any(st.text())},
)
messages = st.fixed_dictionaries(
    {
        "role": _or_any(st.sampled_from(["user", "assistant", "system", "developer", "tool"])),
        "content": _or_any(st.text() | st.lists(_or_any(parts), max_size=3)),
    },
    optional={"type": _or_any(st.just("message"))},
)
calls = st.fixed_dictionaries(
    {"type": st.just("function_call")},
    optional={
        "call_id": _or_any(st.text(max_size=4)),
        "name": _or_any(st.text(max_size=4)),
        "arguments": _or_any(st.text(max_size=8)),
        "id": _or_any(st.text(max_size=4)),
        "status": _or_any(st.sampled_from(["completed", "in_progress", "failed"])),
    },
)
outputs = st.fixed_dictionaries(
    {"type": st.just("function_call_output")},
    optional={
        "call_id": _or_any(st.text(max_size=4)),
        "output": _or_any(st.text(max_size=8) | st.lists(_or_any(parts), max_size=2)),
        "id": _or_any(st.text(max_size=4)),
    },
)
items = messages | calls | outputs
tools = st.fixed_dictionaries(
    {"type": _or_any(st.sampled_from(["function", "web_search", "custom"]))},
    optional={
        "name": _or_any(st.text(max_size=4)),
        "description": _or_any(st.text(max_size=4)),
        "parameters": _or_any(st.just({"type": "object"})),
        "strict": _or_any(st.booleans()),
    },
)
# Mostly fields a client would send, so that most bodies reach `input`'s depths; any JSON in any
# field too, and fields the door refuses.
bodies = st.fixed_dictionaries(
    {
        "model": st.text(min_size=1) | json_values,
        "input": st.text() | st.lists(items | json_values, max_size=3),
    },
    optional={
        "instructions": st.text() | json_values,
        "max_output_tokens": st.integers(1, 64) | json_values,
        "temperature": st.floats(0, 2) | json_values,
        "top_p": st.floats(0, 1) | json_values,
        "stream": st.booleans() | json_values,
        "background": st.booleans() | json_values,
        "store": st.booleans() | json_values,
        "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3) | json_values,
        "user": st.text() | json_values,
        "text": st.fixed_dictionaries({}, optional={"format": json_values}) | json_values,
        "tool_choice": st.sampled_from(["none", "auto", "required"])
        | st.fixed_dictionaries({"type": st.just("function"), "name": _or_any(st.text(max_size=4))})
        | json_values,
        "tools": st.lists(tools, max_size=2) | json_values,
        "parallel_tool_calls": st.booleans() | json_values,
        "previous_response_id": st.text(max_size=4) | json_values,
        "truncation": st.just("disabled") | json_values,
        "reasoning": json_values,
        "include": st.lists(
            st.sampled_from(["message.output_text.logprobs", "reasoning.encrypted_content", "nope"]),
            max_size=2,
        )
        | json_values,
        "top_logprobs": st.integers(-1, 21) | json_values,
    },
)


@settings(max_examples=600, deadline=None)
@given(bodies)
def test_every_body_is_served_or_refused_naming_a_field(body: dict[str, Any]) -> None:
    try:
        request = parse_request(msgspec.json.encode(body))
    except InvalidRequestError as exc:
        assert exc.status_code == 400 and exc.message
        return
    chat = chat_request(request)
    assert isinstance(chat.parsed, ChatCompletionRequest) and chat.body["messages"]
    assert len(chat.sources) == len(chat.body["messages"])
    assert request.model == body["model"]
    # Logprobs are asked of the upstream exactly when the client included them.
    assert chat.parsed.logprobs is ("message.output_text.logprobs" in (body.get("include") or ()))


def test_a_refusal_of_the_logprobs_it_asked_for_names_include() -> None:
    """No upstream the tenant may use serves logprobs: the 400 names the Responses field."""
    body = {"model": "m", "input": "Hi", "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    chat = chat_request(parse_request(msgspec.json.encode(body)))
    assert (chat.body["logprobs"], chat.body["top_logprobs"]) == (True, 2)
    with pytest.raises(InvalidRequestError) as refused, chat.errors_in_request_terms():
        raise InvalidRequestError("`logprobs` is not served here.", param="logprobs")
    assert refused.value.param == "include" and "`include`" in refused.value.message


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"model": "m", "input": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "levels deep"),
        (b'{"model": "m", "input": "caf\xe9"}', "UTF-8"),
        (b"[1]", "JSON object"),
        (b"", "empty"),
    ],
)
def test_a_body_the_parser_cannot_read_is_a_400_not_a_crash(raw: bytes, says: str) -> None:
    """Read as every door reads a JSON body (protocol.openai.decode_json_object): a body nesting
    deeper than msgspec's parser can recurse was a RecursionError here, a 500."""
    with pytest.raises(InvalidRequestError) as refused:
        parse_request(raw)
    assert says in refused.value.message

"""What a request asks (protocol/capabilities.py) for vLLM's sampling extensions the nodes lack:
any of them set to anything but its default asks `vllm_sampling`, naming that field; at its
default, or not given, it asks nothing. Chat and completions alike, decoded from JSON as a client
sends it (null is "not given", as everywhere)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from protocol import ChatCompletionRequest, CompletionRequest
from protocol.capabilities import NODE_CAPABILITIES, VLLM_EXTENSIONS, asked_capabilities
from protocol.openai import decode_request

BASES: list[tuple[type, dict[str, Any]]] = [
    (ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    (CompletionRequest, {"model": "m", "prompt": "hi"}),
]
# A value of each field's type other than its default.
ASKING: dict[str, st.SearchStrategy[Any]] = {
    "min_p": st.floats(0.01, 1.0),
    "repetition_penalty": st.floats(0.1, 2.0).filter(lambda v: v != 1.0),
    "length_penalty": st.floats(0.1, 2.0).filter(lambda v: v != 1.0),
    "min_tokens": st.integers(1, 100),
    "bad_words": st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=3),
    "allowed_token_ids": st.lists(st.integers(0, 1000), max_size=3),
    "prompt_logprobs": st.integers(0, 5),
    "include_stop_str_in_output": st.just(True),
    "skip_special_tokens": st.just(False),
    "spaces_between_special_tokens": st.just(False),
    "truncate_prompt_tokens": st.integers(1, 100),
    "use_beam_search": st.just(True),
    "guided_json": st.dictionaries(st.text(max_size=5), st.integers(), max_size=2) | st.text(max_size=5),
    "guided_regex": st.text(max_size=8),
    "guided_choice": st.lists(st.text(max_size=5), max_size=3),
    "guided_grammar": st.text(max_size=8),
    "structured_outputs": st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
}


def _asks(base: int, fields: dict[str, Any]) -> dict[str, str]:
    struct, body = BASES[base]
    return asked_capabilities(decode_request(msgspec.json.encode({**body, **fields}), struct))


def test_every_extension_has_a_strategy_and_no_node_serves_them() -> None:
    assert set(ASKING) == set(VLLM_EXTENSIONS)
    assert "vllm_sampling" not in NODE_CAPABILITIES


@given(base=st.sampled_from([0, 1]), data=st.data())
def test_an_extension_set_off_its_default_is_asked_by_name(base: int, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(ASKING)))
    asked = _asks(base, {name: data.draw(ASKING[name])})
    assert asked == {"vllm_sampling": name}


@given(
    base=st.sampled_from([0, 1]), names=st.sets(st.sampled_from(sorted(VLLM_EXTENSIONS))), null=st.booleans()
)
def test_extensions_at_their_defaults_or_null_ask_nothing(base: int, names: set[str], null: bool) -> None:
    fields = {}
    for name in names:
        off = VLLM_EXTENSIONS[name]
        fields[name] = None if null or off is None else (list(off) if off == () else off)
    assert _asks(base, fields) == {}

"""What a request asks of the upstream beyond generating text: the capabilities routing matches
against what each upstream serves, and the node refuses with a 400 naming the field.

One definition for both sides: a regional node serves `NODE_CAPABILITIES` and refuses the rest
(regional_node/server/sampling.py); the gateway's router sends a request only to upstreams that
serve everything it asks (router/candidates.py), so a request with `tools` from a tenant allowed
commercial fallback goes to a provider that can call tools instead of getting a node's 400.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Literal, get_args

from protocol.openai import ChatCompletionRequest, CompletionRequest

Capability = Literal[
    "tools",  # tool calling: `tools`, or a conversation with tool calls and tool results
    "functions",  # the legacy form of tool calling
    "structured_output",  # `response_format` other than text
    "logit_bias",
    "penalties",  # non-zero presence or frequency penalty
    "n",  # more than one choice
    "audio",  # output in another modality than text
    "web_search",
    "logprobs",
    "echo",  # completions: the prompt repeated in the answer
    "suffix",  # completions: text to insert before
    "best_of",  # completions: several server-side samples, the best returned
    "vllm_sampling",  # one of vLLM's sampling/decoding extensions the nodes lack (VLLM_EXTENSIONS)
]
ALL_CAPABILITIES: frozenset[Capability] = frozenset(get_args(Capability))
# What Meridian's regional node serves (both engines); it refuses the rest with a 400.
NODE_CAPABILITIES: frozenset[Capability] = frozenset({"logprobs"})

# How an error names each capability to a client.
DESCRIBED: dict[Capability, str] = {
    "tools": "Tool calling",
    "functions": "Function calling",
    "structured_output": "Structured output (`response_format`)",
    "logit_bias": "`logit_bias`",
    "penalties": "A presence or frequency penalty",
    "n": "More than one choice (`n` > 1)",
    "audio": "Output in modalities other than text",
    "web_search": "Web search",
    "logprobs": "Log probability output",
    "echo": "`echo`",
    "suffix": "`suffix`",
    "best_of": "`best_of` > 1",
    "vllm_sampling": "A vLLM sampling extension",
}

# vLLM's extension fields the nodes do not implement, each with its "off" value: set to anything
# else, a request asks for the `vllm_sampling` capability (protocol/openai.py decodes them).
VLLM_EXTENSIONS: dict[str, object] = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "length_penalty": 1.0,
    "min_tokens": 0,
    "bad_words": (),
    "allowed_token_ids": None,
    "prompt_logprobs": None,
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "truncate_prompt_tokens": None,
    "use_beam_search": False,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "structured_outputs": None,
}
_read_extensions = attrgetter(*VLLM_EXTENSIONS)
# Their values in a request that sends none of them (the struct's defaults, shared by both kinds).
_NOT_GIVEN = _read_extensions(CompletionRequest(model="", prompt=""))


def asked_capabilities(request: ChatCompletionRequest | CompletionRequest) -> dict[Capability, str]:
    """Each capability `request` asks for, with the request field that asks for it (an error's
    `param`). A field set to its "off" value (tool_choice "none", a zero penalty, n=1, a text
    response_format) asks for nothing."""
    asked: dict[Capability, str] = {}
    if request.n > 1:
        asked["n"] = "n"
    extensions = _read_extensions(request)
    if extensions != _NOT_GIVEN:  # the usual request sends none: one comparison, not 17
        for name, value in zip(VLLM_EXTENSIONS, extensions, strict=True):
            off = VLLM_EXTENSIONS[name]
            # Not given (None) or its off value asks nothing; an empty list is "off" for bad_words.
            if value is not None and value != off and not (off == () and not value):
                asked["vllm_sampling"] = name
                break
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        if value is not None and value != 0:
            asked.setdefault("penalties", name)
    if request.logit_bias:
        asked["logit_bias"] = "logit_bias"
    if (request.response_format or {}).get("type", "text") != "text":
        asked["structured_output"] = "response_format"
    # With tool_choice "none" the model must not call tools: a model without tools does just that.
    if request.tools and request.tool_choice != "none":
        asked["tools"] = "tools"
    if isinstance(request, CompletionRequest):
        if request.logprobs is not None:
            asked["logprobs"] = "logprobs"
        if request.best_of is not None and request.best_of > 1:
            asked["best_of"] = "best_of"
        if request.echo:
            asked["echo"] = "echo"
        if request.suffix:
            asked["suffix"] = "suffix"
        return asked
    if request.logprobs:
        asked["logprobs"] = "logprobs"
    if "tools" not in asked:
        # Earlier tool calls and their results are a conversation only a tool-calling model reads.
        for index, message in enumerate(request.messages):
            if message.role == "tool" or message.tool_calls:
                field = "role" if message.role == "tool" else "tool_calls"
                asked["tools"] = f"messages[{index}].{field}"
                break
    if request.functions and request.function_call != "none":
        asked["functions"] = "functions"
    if request.web_search_options is not None:
        asked["web_search"] = "web_search_options"
    if request.audio is not None or set(request.modalities or ()) - {"text"}:
        asked["audio"] = "audio" if request.audio is not None else "modalities"
    return asked

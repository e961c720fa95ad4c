"""OpenAI request fields to the engine's SamplingParams, and the features this node refuses.

Refusals are explicit 400s naming the field, for every capability the request asks that the
node does not serve (protocol/capabilities.py: n > 1, penalties, logit_bias, structured output,
tools and legacy functions, audio output, web search, echo, suffix, best_of): silently ignoring
them would return text the client did not ask for.
"""

from __future__ import annotations

from protocol import ChatCompletionRequest, CompletionRequest, InvalidRequestError
from protocol.capabilities import NODE_CAPABILITIES, Capability, asked_capabilities
from regional_node.engine import SamplingParams
from regional_node.engine.sampling_params import MAX_TOP_LOGPROBS

# OpenAI's limits on alternatives per token: chat's `top_logprobs`, completions' `logprobs`.
MAX_COMPLETION_LOGPROBS = 5


# The node's refusal of each capability it does not serve (protocol/capabilities.py).
_REFUSALS: dict[Capability, str] = {
    "n": "Only n=1 is supported; send one request per completion you need.",
    "penalties": "`{param}` is not supported on this node; omit it or send 0.",
    "logit_bias": "`logit_bias` is not supported on this node.",
    "structured_output": "`response_format` of type {response_type!r} is not supported on this node; only 'text'.",
    "tools": "Tool calling (asked by `{param}`) is not supported on this node; omit `tools` (or set "
    "`tool_choice` to 'none') and send no tool calls or tool results.",
    "functions": "Function calling is not supported on this node; omit `functions` or set "
    "`function_call` to 'none'.",
    "web_search": "Web search is not available on this node; omit `web_search_options`.",
    "audio": "Only text output is supported on this node; omit `audio` and ask only for the 'text' modality.",
    "best_of": "Only best_of=1 is supported on this node.",
    "echo": "`echo` is not supported on this node.",
    "suffix": "`suffix` is not supported on this node.",
    "vllm_sampling": "`{param}` (a vLLM sampling extension) is not supported on this node; omit it "
    "or send its default.",
}


def check_supported(request: ChatCompletionRequest | CompletionRequest) -> None:
    """Raise a 400 for any requested capability this node does not serve, or a value out of range."""
    if request.n < 1:
        raise InvalidRequestError(f"`n` must be at least 1, got {request.n}.", param="n")
    for capability, param in asked_capabilities(request).items():
        if capability not in NODE_CAPABILITIES:
            response_type = (request.response_format or {}).get("type", "text")
            message = _REFUSALS[capability].format(param=param, response_type=response_type)
            raise InvalidRequestError(message, param=param)
    if isinstance(request, CompletionRequest):
        if request.best_of is not None and request.best_of < 1:
            raise InvalidRequestError(
                f"`best_of` must be at least 1, got {request.best_of}.", param="best_of"
            )
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise InvalidRequestError(
                f"`logprobs` must be between 0 and {MAX_COMPLETION_LOGPROBS}.", param="logprobs"
            )
    else:
        top = request.top_logprobs
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}.", param="top_logprobs"
            )
        if top and not request.logprobs:
            raise InvalidRequestError("`top_logprobs` needs `logprobs` set to true.", param="top_logprobs")


def sampling_params(
    request: ChatCompletionRequest | CompletionRequest, *, prompt_tokens: int, max_total_tokens: int
) -> SamplingParams:
    """The engine's settings for `request`. Without max_tokens, generation may fill the context
    (`max_total_tokens`: what the model's context and its KV pool both allow, prompt included).

    The engine validates the values (ranges, types) and raises InvalidRequestError naming the
    field; that is mapped to a 400 in one place (server/errors.py).
    """
    max_tokens = request.requested_max_tokens()
    if max_tokens is None:
        # As OpenAI and vLLM: no limit means "until the context window is full".
        max_tokens = max(1, max_total_tokens - prompt_tokens)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        # vLLM spells "no top-k" as -1; the engine as 0.
        top_k=0 if request.top_k in (None, -1) else request.top_k,
        seed=request.seed,
        stop=[s for s in request.stop_list() if s],
        stop_token_ids=list(request.stop_token_ids or []),
        ignore_eos=request.ignore_eos,
        # Chat's `logprobs` is a flag; completions' a count (0: the sampled token's only) or None.
        logprobs=request.logprobs is not None and request.logprobs is not False,
        top_logprobs=_alternatives_asked(request),
        speculative=request.speculative,
    )


def _alternatives_asked(request: ChatCompletionRequest | CompletionRequest) -> int:
    """How many alternatives per token the request asks for: chat's `top_logprobs`, completions'
    `logprobs` count (decoded as an int: a bool there is refused at decoding)."""
    if isinstance(request, CompletionRequest):
        return request.logprobs or 0
    return (request.top_logprobs or 0) if request.logprobs else 0

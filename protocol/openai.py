"""msgspec structs for OpenAI's chat and completions requests and responses.

Requests accept unknown fields (OpenAI clients send many optional ones); types are strict, so
`"max_tokens": "ten"` is a 400 naming the field rather than a coercion. Meridian extensions are
marked; OpenAI's SDKs pass them through `extra_body`.
"""

from __future__ import annotations

import functools
import re
from itertools import accumulate
from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from protocol.errors import InvalidRequestError

Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "abort", "error"]


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # An assistant's tool calls and a tool message's answer to one: only upstreams serving tools
    # read them (protocol/capabilities.py); they are forwarded as the client sent them.
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text; non-text content parts are rejected earlier, in validation."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Features the node refuses explicitly (server/sampling.py) rather than silently ignoring.
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    # An object names a tool (`{"type": "function", ...}`, or another kind an upstream knows).
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    # Meridian extensions (vLLM uses the same names for the first four).
    top_k: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    # Each streamed choice carries the token ids it adds (`token_ids`); the gateway uses them to
    # continue a broken stream token-exactly on another node.
    return_token_ids: bool = False
    # Continues a stream: tokens already generated, whose streamed chunks you received, in order.
    # The node goes on exactly after them (text it held back, e.g. a possible stop string's start,
    # comes with the next chunk) and ends at once if they already end the request. They count as
    # prompt tokens in usage; max_tokens counts only new tokens (0 asks only how they end).
    continuation_token_ids: list[int] | None = None
    # false: never decode this request speculatively, whatever the serving node's policy (e.g. to
    # keep a seeded sample stream reproducible against a node without speculation). The tokens do
    # not depend on it (greedy: the same; sampled: the same distribution); only how they are made.
    speculative: bool = True
    # vLLM's sampling and decoding extensions that Meridian's nodes do not implement. Decoded (not
    # dropped as unknown) so that a request setting one to anything but its "off" value asks for
    # it (protocol/capabilities.py, VLLM_EXTENSIONS): a node refuses it by name, the gateway
    # routes it only to an OpenAI-compatible provider, which gets it as sent.
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float | None = None
    min_tokens: int | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    use_beam_search: bool = False
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[Any] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Served as text, a choice that asks for a call would answer another question than the
        # one asked; OpenAI and vLLM refuse it too.
        if not self.tools and (
            self.tool_choice == "required"
            or (isinstance(self.tool_choice, dict) and self.tool_choice.get("type") == "function")
        ):
            raise InvalidRequestError(
                "This `tool_choice` asks for a tool call and needs `tools` to choose from.",
                param="tool_choice",
            )

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # Refused by the node like `tools` (server/sampling.py): the legacy form of tools, output in
    # other modalities than text, and a web search before answering.
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    # Meridian/vLLM extensions for the chat template.
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields, kw_only=True):
    # OpenAI accepts a string, a list of strings, token ids, or a list of token-id lists. msgspec
    # allows one array type per union, so the list's shape is checked after decoding.
    prompt: str | list[str | int | list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def requested_max_tokens(self) -> int:
        # OpenAI's legacy completions default to 16 tokens.
        return self.max_tokens if self.max_tokens is not None else 16


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatLogprobToken(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[Any] = msgspec.field(default_factory=list)


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[ChatLogprobToken] | None = None


class ResponseMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None
    # Meridian extension: the generated token ids, when the request set return_token_ids.
    token_ids: list[int] | None = None
    # vLLM's: the stop string or stop token id that ended the choice, null when something else
    # did (EOS, length). The node sets it on every finished choice; UNSET keeps it off the chunks
    # that do not finish, as vLLM's chat stream does.
    stop_reason: str | int | UnsetType | None = UNSET


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class ChatDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = None
    stop_reason: str | int | UnsetType | None = UNSET  # as ChatChoice's


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None = None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float] = msgspec.field(default_factory=list)
    top_logprobs: list[Any] | None = None
    text_offset: list[int] = msgspec.field(default_factory=list)


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None
    stop_reason: str | int | UnsetType | None = UNSET  # as ChatChoice's


class CompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    usage: Usage | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    created: int
    owned_by: str = "meridian"
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelCard]
    object: Literal["list"] = "list"


RequestT = TypeVar("RequestT", bound=msgspec.Struct)

_PATH_FIELD = re.compile(r"`\$\.?([^`]*)`")


def decode_request(body: bytes, request_type: type[RequestT]) -> RequestT:
    """Decode a JSON body into a request struct, or raise a 400 that names the offending field."""
    return decode_request_and_object(body, request_type)[0]


# Bodies nesting deeper than this are refused with a 400 before they are parsed: msgspec's parser
# recurses per level (about 1,000 levels exhaust the stack). Requests need a handful of levels;
# JSON schemas in tools or response_format a few dozen at most.
MAX_JSON_DEPTH = 128

# A JSON string (escapes included): skipped when counting brackets, as its brackets are text.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
# +1 for an opening bracket, -1 for a closing one (only brackets are left when this is applied).
_DEPTH_STEP = [0] * 256
for _open in b"[{":
    _DEPTH_STEP[_open] = 1
for _close in b"]}":
    _DEPTH_STEP[_close] = -1


def json_depth_exceeds(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text nests arrays/objects more than `limit` deep. Linear and without
    recursion: strings are cut out, then the running bracket count is scanned, all in C."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # the usual case: too few brackets to nest that deep, decided without a scan
    skeleton = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    depths = accumulate(map(_DEPTH_STEP.__getitem__, skeleton))
    return next(filter(limit.__lt__, depths), None) is not None  # stops at the first level too deep


def decode_json_object(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a 400: empty, not UTF-8 JSON, nesting deeper than
    MAX_JSON_DEPTH (which would exhaust the parser's recursion), or not an object. Every door
    that reads a JSON body reads it with this."""
    if not body.strip():
        raise InvalidRequestError("The request body is empty; expected a JSON object.")
    if json_depth_exceeds(body):
        raise InvalidRequestError(
            f"The request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep."
        )
    try:
        raw = msgspec.json.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        # msgspec checks UTF-8 as it reads strings; before 0.23 it raised UnicodeDecodeError, since
        # then a DecodeError without the byte. The message names the byte either way.
        raise InvalidRequestError(_why_not_json(body, exc)) from None
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"The request body must be a JSON object, not {type(raw).__name__}.")
    return raw


def _why_not_json(body: bytes, exc: Exception) -> str:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"The request body is not valid UTF-8 (byte {bad.start}: {bad.reason})."
    return f"The request body is not valid JSON: {exc}"


@functools.cache
def _integer_fields(request_type: type[msgspec.Struct]) -> tuple[str, ...]:
    """The request's top-level fields typed as integers (never booleans), by their JSON names."""
    names = []
    for field in msgspec.inspect.type_info(request_type).fields:  # type: ignore[attr-defined]
        kind = field.type
        kinds = kind.types if isinstance(kind, msgspec.inspect.UnionType) else (kind,)
        if any(isinstance(k, msgspec.inspect.IntType) for k in kinds):
            names.append(field.encode_name)
    return tuple(names)


def whole_numbers_as_integers(raw: dict[str, Any], names: tuple[str, ...]) -> None:
    """`max_tokens: 5.0` is the integer 5: JSON has one number type, JSON Schema (the OpenAPI
    document's dialect) counts 5.0 as an integer, and vLLM's and LiteLLM's servers take it. The
    fields `names` of `raw` are rewritten in place, so the body forwarded upstream says 5 too; a
    fraction (5.5) is left for the struct to refuse."""
    for name in names:
        value = raw.get(name)
        if type(value) is float and value.is_integer():
            raw[name] = int(value)


def decode_request_and_object(body: bytes, request_type: type[RequestT]) -> tuple[RequestT, dict[str, Any]]:
    """The request struct and the JSON object it was read from (for a proxy that forwards the
    client's fields as they came), decoded once; a 400 naming the field as `decode_request`, and
    the 400s of `decode_json_object`. A whole number in an integer field is that integer."""
    raw = decode_json_object(body)
    whole_numbers_as_integers(raw, _integer_fields(request_type))
    try:
        # OpenAI treats an explicit `null` as "not given"; many clients send them for defaults.
        return msgspec.convert({k: v for k, v in raw.items() if v is not None}, request_type), raw
    except msgspec.ValidationError as exc:
        message = str(exc)
        match = _PATH_FIELD.search(message)
        # `$[...]` is msgspec's "somewhere in the document" (e.g. a number out of range), not a field.
        param = match.group(1) if match and match.group(1) and not match.group(1).startswith("[") else None
        missing = re.search(r"missing required field `([^`]+)`", message)
        if missing:
            param = missing.group(1)
        raise InvalidRequestError(f"Invalid request: {message}", param=param) from None

"""The typed answer that travels the call path: upstream parser → relay → safety → front door.

One set of structs for a streamed chunk (`Chunk`) and a whole answer (`Completion`), in OpenAI's
chat and completions shapes (chat choices carry `delta` or `message`, completions `text`). They
are decoded once from the upstream's bytes and encoded once by the front door; every stage in
between reads and writes attributes, never dict keys.

Only the fields named here reach the client. An upstream's unknown fields are dropped on decode,
so nothing the safety layer does not know about can carry model text past it.

**The fields that carry model-generated text are named in one place**, `Choice.channels()`:
content (or a completion's text), refusal, reasoning, and each tool call's arguments; and
`Choice.token_logprobs()`: the logprobs that belong to a channel's text (chat `content` and
`refusal`, a completion's `tokens`), whose `token`, `bytes` and `top_logprobs` are model text too.
Output safety (gateway/safety/output.py) holds, redacts and drops every one of them together.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from protocol.timing import TIMINGS_FIELD


class _Wire(msgspec.Struct, kw_only=True, omit_defaults=False):
    """UNSET fields are left out on encode; None is written as null (OpenAI's shapes need both)."""


class TopLogprob(_Wire):
    token: str
    logprob: float = 0.0
    bytes: list[int] | UnsetType | None = UNSET


class TokenLogprob(_Wire):
    token: str
    logprob: float = 0.0
    bytes: list[int] | UnsetType | None = UNSET
    top_logprobs: list[TopLogprob] | UnsetType = UNSET


class Logprobs(_Wire):
    """Chat's shape (`content`, `refusal`) or completions' (`tokens` and its parallel lists)."""

    content: list[TokenLogprob] | UnsetType | None = UNSET
    refusal: list[TokenLogprob] | UnsetType | None = UNSET
    tokens: list[str] | UnsetType = UNSET
    token_logprobs: list[float | None] | UnsetType = UNSET
    top_logprobs: list[dict[str, float] | None] | UnsetType | None = UNSET
    text_offset: list[int] | UnsetType = UNSET


class FunctionCall(_Wire):
    name: str | UnsetType | None = UNSET
    arguments: str | UnsetType | None = UNSET


class ToolCall(_Wire):
    index: int | UnsetType = UNSET  # streamed deltas say which call a fragment belongs to
    id: str | UnsetType | None = UNSET
    type: str | UnsetType | None = UNSET
    function: FunctionCall | UnsetType = UNSET


class Message(_Wire):
    """A chat choice's `delta` (streamed) or `message` (whole)."""

    role: str | UnsetType | None = UNSET
    content: str | UnsetType | None = UNSET
    refusal: str | UnsetType | None = UNSET
    reasoning_content: str | UnsetType | None = UNSET
    tool_calls: list[ToolCall] | UnsetType | None = UNSET


# The text channels of one choice; "tool:<i>" for tool call i's arguments.
CONTENT = "content"
REFUSAL = "refusal"
REASONING = "reasoning"


class Choice(_Wire):
    index: int = 0
    delta: Message | UnsetType = UNSET
    message: Message | UnsetType = UNSET
    text: str | UnsetType = UNSET
    logprobs: Logprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | UnsetType | None = UNSET  # vLLM's matched stop string or token
    token_ids: list[int] | UnsetType | None = UNSET

    @property
    def body(self) -> Message | None:
        """The chat message part (delta or message); None for a completions choice."""
        if self.delta is not UNSET:
            return self.delta
        if self.message is not UNSET:
            return self.message
        return None

    def channels(self) -> dict[str, str]:
        """Every piece of model text this choice carries, by channel (logprobs apart)."""
        body = self.body
        if body is None:
            return {CONTENT: self.text} if isinstance(self.text, str) and self.text else {}
        out: dict[str, str] = {}
        if isinstance(body.content, str) and body.content:
            out[CONTENT] = body.content
        if isinstance(body.refusal, str) and body.refusal:
            out[REFUSAL] = body.refusal
        if isinstance(body.reasoning_content, str) and body.reasoning_content:
            out[REASONING] = body.reasoning_content
        for position, call in enumerate(body.tool_calls or ()):
            function = call.function
            if function is not UNSET and isinstance(function.arguments, str) and function.arguments:
                out[tool_channel(call, position)] = function.arguments
        return out

    def set_channel(self, channel: str, text: str) -> None:
        """Write `channel`'s text (what the checks released for it)."""
        body = self.body
        if body is None:
            if channel == CONTENT:
                self.text = text
            return
        if channel == CONTENT:
            body.content = text if text or body.content is not None else body.content
        elif channel == REFUSAL:
            body.refusal = text if text else UNSET
        elif channel == REASONING:
            body.reasoning_content = text if text else UNSET
        else:
            for position, call in enumerate(body.tool_calls or ()):
                if tool_channel(call, position) == channel and call.function is not UNSET:
                    call.function.arguments = text

    def content(self) -> str:
        """The content (or completion text) alone: what continuation and collection join."""
        body = self.body
        if body is None:
            return self.text if isinstance(self.text, str) else ""
        return body.content if isinstance(body.content, str) else ""

    def token_logprobs(self, channel: str) -> list[Any] | None:
        """The logprob entries that belong to `channel`'s text: TokenLogprob (chat) or the
        completion's token strings; None when there are none."""
        logprobs = self.logprobs
        if logprobs is None:
            return None
        if channel == CONTENT:
            if isinstance(logprobs.content, list):
                return logprobs.content
            if isinstance(logprobs.tokens, list):
                return logprobs.tokens
        if channel == REFUSAL and isinstance(logprobs.refusal, list):
            return logprobs.refusal
        return None

    def drop_text(self) -> None:
        """Everything model-written goes: a blocked choice keeps only its index and finish."""
        body = self.body
        if body is not None:
            body.content = "" if body.content is not UNSET else UNSET
            body.refusal = UNSET
            body.reasoning_content = UNSET
            body.tool_calls = UNSET
        elif self.text is not UNSET:
            self.text = ""
        self.logprobs = None
        self.token_ids = UNSET

    @property
    def announces(self) -> bool:
        """Carries something for the client beside text: a role, a tool call's id or name, a finish."""
        if self.finish_reason is not None:
            return True
        body = self.body
        if body is None:
            return False
        if isinstance(body.role, str) and body.role:
            return True
        return any(
            call.id or (call.function is not UNSET and call.function.name) for call in body.tool_calls or ()
        )


def tool_channel(call: ToolCall, position: int) -> str:
    return f"tool:{call.index if isinstance(call.index, int) else position}"


class Usage(_Wire):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, Any] | UnsetType | None = UNSET
    completion_tokens_details: dict[str, Any] | UnsetType | None = UNSET

    @property
    def cached_tokens(self) -> int:
        details = self.prompt_tokens_details
        return int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


class ErrorBody(_Wire):
    message: str = "stream error"
    type: str | None = None
    code: str | int | None = None
    param: str | None = None


class _Answer(_Wire):
    id: str = ""
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    system_fingerprint: str | UnsetType | None = UNSET
    choices: list[Choice] = msgspec.field(default_factory=list)
    usage: Usage | UnsetType | None = UNSET
    # The upstream's latency breakdown (protocol/timing.py); the request path takes it out.
    timings: dict[str, float] | UnsetType | None = msgspec.field(default=UNSET, name=TIMINGS_FIELD)


# The prompt an upstream counted, known when its stream opens (before any usage chunk): our nodes
# send it in these response headers, an Anthropic provider in its message_start; the upstream
# parser puts it on the stream's first chunk as `opened_usage`. /v1/messages needs it for its
# first event (message_start's input_tokens, which clients such as Claude Code display).
PROMPT_TOKENS_HEADER = "x-meridian-prompt-tokens"
CACHED_TOKENS_HEADER = "x-meridian-cached-tokens"
OPENED_USAGE_FIELD = "meridian_opened_usage"


class Chunk(_Answer):
    """One streamed chunk (`chat.completion.chunk` or a streamed `text_completion`)."""

    object: str = "chat.completion.chunk"
    # An upstream's in-band error event (`{"error": {...}}`): the upstream parser raises on it.
    error: ErrorBody | UnsetType = UNSET
    # The usage when the stream opened (the prompt, nothing generated yet), on the first chunk
    # only; the relay takes it out, so no client sees it.
    opened_usage: Usage | UnsetType = msgspec.field(default=UNSET, name=OPENED_USAGE_FIELD)


def opened_usage(prompt_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        total_tokens=prompt_tokens,
        prompt_tokens_details={"cached_tokens": cached_tokens},
    )


class Completion(_Answer):
    """A whole answer (`chat.completion` or `text_completion`)."""


class StreamFailed(msgspec.Struct, frozen=True, kw_only=True):
    """The explicit end of a stream that could not be finished (never sent as a chunk: each front
    door writes it in its own error format). `code` is OpenAI's error code; `kind` its type."""

    message: str
    code: str = "stream_interrupted"
    kind: str = "server_error"


# What a stream carries to its client: chunks, and at most one StreamFailed, last.
Streamed = Chunk | StreamFailed


def usage_of(value: Usage | UnsetType | None) -> Usage | None:
    return value if isinstance(value, Usage) else None


chunk_decoder = msgspec.json.Decoder(Chunk)
completion_decoder = msgspec.json.Decoder(Completion)
encoder = msgspec.json.Encoder()


def chunk_from(value: Any) -> Chunk:
    """A chunk from builtins (a translator's dict); raises msgspec.ValidationError."""
    return msgspec.convert(value, Chunk)


def completion_from(value: Any) -> Completion:
    return msgspec.convert(value, Completion)


def to_builtins(value: Chunk | Completion) -> dict[str, Any]:
    """For the front doors that translate to another API's shape (Anthropic, Responses)."""
    return msgspec.to_builtins(value)  # type: ignore[no-any-return]

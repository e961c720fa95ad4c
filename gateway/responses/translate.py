"""A Responses API request (text subset) as the pipeline's chat request.

`input` is a string (one user message) or a list of messages whose content is a string or text
parts; `instructions` becomes the first system message. Everything else the Responses API has
(tools, file and image inputs, reasoning, conversation state) is refused with a 400 naming the
field, rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol import ChatCompletionRequest, InvalidRequestError
from protocol.objects import METADATA_KEYS
from protocol.openai import decode_json_object, whole_numbers_as_integers

# Fields that are accepted as given; all others are refused (the set the text subset serves).
_SUPPORTED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "background",
        "metadata",
        "user",
        "store",
        "text",
        "tool_choice",
        "tools",
        "parallel_tool_calls",
        "truncation",
    }
)
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = {"input_text", "output_text"}


@dataclass(frozen=True)
class InputMessage:
    """One message of `input` as the client sent it (its role as given, its text joined), for the
    response's input items."""

    role: str
    text: str


@dataclass(frozen=True)
class ResponsesRequest:
    """What the response object echoes back, and how the run is driven."""

    model: str
    input: tuple[InputMessage, ...] = ()
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    user: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


def _unsupported(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{what} is not supported: Meridian's Responses API serves text in and text out "
        "(input text or messages, instructions, max_output_tokens, temperature, top_p, stream, "
        "background, metadata, user).",
        param=param,
        code="unsupported_parameter",
    )


def _check_unsupported(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key not in _SUPPORTED and value is not None:
            raise _unsupported(key, f"'{key}'")
    if body.get("tools"):
        raise _unsupported("tools", "'tools'")
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise _unsupported("tool_choice", "'tool_choice'")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if (
            not isinstance(text, dict)
            or set(text) - {"format"}
            or (fmt is not None and fmt != {"type": "text"})
        ):
            raise _unsupported("text", "A 'text' setting other than format {'type': 'text'}")
    if body.get("truncation") not in (None, "disabled"):
        raise _unsupported("truncation", "'truncation' other than 'disabled'")


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError("must be a string or a list of input_text parts.", param=param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in _TEXT_PARTS:  # a JSON object is no set member
            raise _unsupported(f"{param}[{j}]", f"A content part of type {kind!r}")
        if not isinstance(part.get("text"), str):
            raise InvalidRequestError("must be a string.", param=f"{param}[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def _input(value: Any) -> tuple[InputMessage, ...]:
    if isinstance(value, str):
        return (InputMessage("user", value),)
    if not isinstance(value, list) or not value:
        raise InvalidRequestError("'input' must be a string or a non-empty list of messages.", param="input")
    messages = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError("must be a message object.", param=param)
        if item.get("type", "message") != "message":
            raise _unsupported(param, f"An input item of type {item.get('type')!r}")
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise InvalidRequestError(
                "'role' must be one of user, assistant, system, developer.", param=f"{param}.role"
            )
        messages.append(InputMessage(role, _content_text(item.get("content"), f"{param}.content")))
    return tuple(messages)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequestError(f"'{name}' must be a number from {low:g} to {high:g}.", param=name)
    return float(value)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequestError(f"'{name}' must be a boolean.", param=name)
    return value


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if (
        not isinstance(value, dict)
        or len(value) > METADATA_KEYS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    ):
        raise InvalidRequestError(
            f"'metadata' must map at most {METADATA_KEYS} string keys to string values.",
            param="metadata",
        )
    return value


def parse_request(raw: bytes) -> tuple[ResponsesRequest, dict[str, Any], ChatCompletionRequest]:
    """The request, its chat body (always streamed from the node, with usage) and that body's
    struct. Every refusal is an InvalidRequestError naming the field."""
    body = decode_json_object(raw)
    _check_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required.", param="model")
    if "input" not in body:
        raise InvalidRequestError("'input' is required.", param="input")
    given = _input(body["input"])
    messages = [{"role": _ROLES[m.role], "content": m.text} for m in given]
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequestError("'instructions' must be a string.", param="instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    whole_numbers_as_integers(body, ("max_output_tokens",))
    max_output = body.get("max_output_tokens")
    if max_output is not None and (
        isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1
    ):
        raise InvalidRequestError(
            "'max_output_tokens' must be a positive integer.", param="max_output_tokens"
        )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequestError("'user' must be a string.", param="user")
    request = ResponsesRequest(
        model=model,
        input=given,
        instructions=instructions,
        max_output_tokens=max_output,
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1),
        stream=_flag(body, "stream", False),
        background=_flag(body, "background", False),
        store=_flag(body, "store", True),
        user=user,
        metadata=_metadata(body.get("metadata")),
    )
    if request.background and request.stream:
        raise _unsupported("stream", "Streaming a background response")
    if request.background and not request.store:
        raise InvalidRequestError(
            "A background response must be stored: 'store' cannot be false.", param="store"
        )
    # The run always reads a stream (so a cancel can abort it mid-generation) with its usage.
    chat: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for name, value in (
        ("max_tokens", max_output),
        ("temperature", request.temperature),
        ("top_p", request.top_p),
        ("user", user),
    ):
        if value is not None:
            chat[name] = value
    return request, chat, msgspec.convert(chat, ChatCompletionRequest)

"""A Responses API request (text and function tools) as the pipeline's chat request.

`input` is a string (one user message) or a list of items (gateway/responses/items.py): messages
whose content is a string or text parts, function calls and their outputs; `instructions` becomes
the first system message; `previous_response_id` puts the earlier response's conversation (its
input and output, not its instructions) before this input. `tools` of type "function" become chat
function tools; `tool_choice` and `parallel_tool_calls` go with them; `include` of
`message.output_text.logprobs` (with `top_logprobs`) asks the chat request for logprobs. Everything
else the Responses API has (other tool types, file and image inputs, reasoning, conversations) is
refused with a 400 naming the field, rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from gateway.responses.items import InputItem, chat_messages, parse_input, unsupported
from gateway.translate.chat_request import ChatRequest
from protocol import ChatCompletionRequest, InvalidRequestError
from protocol.objects import (
    INCLUDE_LOGPROBS,
    MAX_RESPONSES_TOP_LOGPROBS,
    METADATA_KEYS,
    RESPONSES_INCLUDABLE,
)
from protocol.openai import decode_json_object, whole_numbers_as_integers

# The chat fields the pipeline's errors name that a Responses request calls otherwise.
_CHAT_FIELD_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "logprobs": "include"}

# Fields that are accepted as given; all others are refused (the set the door serves).
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
        "previous_response_id",
        "include",
        "top_logprobs",
    }
)
_INCLUDABLE = frozenset(RESPONSES_INCLUDABLE)
_FUNCTION_TOOL_FIELDS = frozenset({"type", "name", "description", "parameters", "strict"})
_CHOICE_MODES = frozenset({"auto", "none", "required"})


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def as_chat(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        for key in ("description", "parameters", "strict"):
            value = getattr(self, key)
            if value is not None:
                function[key] = value
        return {"type": "function", "function": function}

    def echoed(self) -> dict[str, Any]:
        """As the response object lists it."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.strict,
        }


@dataclass(frozen=True)
class NamedFunction:
    """`tool_choice` naming the function the model must call."""

    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedFunction


@dataclass(frozen=True)
class ResponsesRequest:
    """What the response object echoes back, and how the run is driven."""

    model: str
    input: tuple[InputItem, ...] = ()
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    user: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    include: tuple[str, ...] = ()
    top_logprobs: int | None = None  # alternatives per token, with INCLUDE_LOGPROBS

    @property
    def logprobs(self) -> bool:
        return INCLUDE_LOGPROBS in self.include

    def echoed_tool_choice(self) -> str | dict[str, str]:
        choice = self.tool_choice
        return {"type": "function", "name": choice.name} if isinstance(choice, NamedFunction) else choice


def _check_unsupported(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key not in _SUPPORTED and value is not None:
            raise unsupported(key, f"'{key}'")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if (
            not isinstance(text, dict)
            or set(text) - {"format"}
            or (fmt is not None and fmt != {"type": "text"})
        ):
            raise unsupported("text", "A 'text' setting other than format {'type': 'text'}")
    if body.get("truncation") not in (None, "disabled"):
        raise unsupported("truncation", "'truncation' other than 'disabled'")


def _tool(tool: Any, param: str) -> FunctionTool:
    if not isinstance(tool, dict):
        raise InvalidRequestError("must be a tool object.", param=param)
    kind = tool.get("type")
    if kind != "function":
        raise unsupported(f"{param}.type", f"A tool of type {kind!r}")
    for key in tool:
        if key not in _FUNCTION_TOOL_FIELDS:
            raise unsupported(f"{param}.{key}", f"'{key}' in a function tool")
    name, description = tool.get("name"), tool.get("description")
    parameters, strict = tool.get("parameters"), tool.get("strict")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("'name' must be a non-empty string.", param=f"{param}.name")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError("'description' must be a string.", param=f"{param}.description")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequestError("'parameters' must be a JSON schema object.", param=f"{param}.parameters")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequestError("'strict' must be a boolean.", param=f"{param}.strict")
    return FunctionTool(name, description, parameters, strict)


def _tools(value: Any) -> tuple[FunctionTool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequestError("'tools' must be a list of tools.", param="tools")
    return tuple(_tool(tool, f"tools[{i}]") for i, tool in enumerate(value))


def _tool_choice(value: Any, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    """Whether a named function is one of `tools` is the upstream's to say, as on the chat door."""
    choice: ToolChoice
    if value is None:
        return "auto"
    if isinstance(value, str) and value in _CHOICE_MODES:
        choice = value  # type: ignore[assignment]  # one of the Literal's values, checked above
    elif isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError("'name' must be a non-empty string.", param="tool_choice.name")
        choice = NamedFunction(name)
    elif isinstance(value, dict | str):
        raise unsupported("tool_choice", f"A 'tool_choice' of {value!r}")
    else:
        raise InvalidRequestError(
            "'tool_choice' must be auto, none, required or a function.", param="tool_choice"
        )
    if not tools and choice not in ("auto", "none"):
        raise InvalidRequestError("This 'tool_choice' needs 'tools' to choose from.", param="tool_choice")
    return choice


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequestError(f"'{name}' must be a number from {low:g} to {high:g}.", param=name)
    return float(value)


def _optional_flag(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequestError(f"'{name}' must be a boolean.", param=name)
    return value


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = _optional_flag(body, name)
    return default if value is None else value


def _optional_string(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(f"'{name}' must be a string.", param=name)
    return value


def _include(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequestError("'include' must be a list of strings.", param="include")
    for i, name in enumerate(value):
        if not isinstance(name, str) or name not in _INCLUDABLE:
            raise InvalidRequestError(
                f"{name!r} is not a value 'include' takes: one of {', '.join(RESPONSES_INCLUDABLE)}.",
                param=f"include[{i}]",
            )
    return tuple(value)


def _top_logprobs(body: dict[str, Any]) -> int | None:
    value = body.get("top_logprobs")
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RESPONSES_TOP_LOGPROBS
    ):
        raise InvalidRequestError(
            f"'top_logprobs' must be an integer from 0 to {MAX_RESPONSES_TOP_LOGPROBS}.", param="top_logprobs"
        )
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


def parse_request(raw: bytes) -> ResponsesRequest:
    """Every refusal is an InvalidRequestError naming the field."""
    body = decode_json_object(raw)
    _check_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required.", param="model")
    if "input" not in body:
        raise InvalidRequestError("'input' is required.", param="input")
    given = parse_input(body["input"])
    whole_numbers_as_integers(body, ("max_output_tokens", "top_logprobs"))
    max_output = body.get("max_output_tokens")
    if max_output is not None and (
        isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1
    ):
        raise InvalidRequestError(
            "'max_output_tokens' must be a positive integer.", param="max_output_tokens"
        )
    tools = _tools(body.get("tools"))
    request = ResponsesRequest(
        model=model,
        input=given,
        instructions=_optional_string(body, "instructions"),
        max_output_tokens=max_output,
        temperature=_number(body, "temperature", 0, 2),
        top_p=_number(body, "top_p", 0, 1),
        stream=_flag(body, "stream", False),
        background=_flag(body, "background", False),
        store=_flag(body, "store", True),
        user=_optional_string(body, "user"),
        metadata=_metadata(body.get("metadata")),
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=_optional_flag(body, "parallel_tool_calls"),
        previous_response_id=_optional_string(body, "previous_response_id"),
        include=_include(body.get("include")),
        top_logprobs=_top_logprobs(body),
    )
    if request.background and request.stream:
        raise unsupported("stream", "Streaming a background response")
    if request.background and not request.store:
        raise InvalidRequestError(
            "A background response must be stored: 'store' cannot be false.", param="store"
        )
    return request


def chat_request(request: ResponsesRequest, earlier: tuple[InputItem, ...] = ()) -> ChatRequest:
    """`request` as a chat request, after `earlier` (the conversation of its previous response)."""
    messages, sources = chat_messages(
        earlier + request.input,
        ("previous_response_id",) * len(earlier) + tuple(f"input[{i}]" for i in range(len(request.input))),
    )
    if request.instructions is not None:
        messages.insert(0, {"role": "system", "content": request.instructions})
        sources.insert(0, "instructions")
    # The run always reads a stream (so a cancel can abort it mid-generation) with its usage.
    chat: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        # Chat APIs take tool_choice and parallel_tool_calls only beside tools.
        chat["tools"] = [tool.as_chat() for tool in request.tools]
        choice = request.tool_choice
        chat["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}}
            if isinstance(choice, NamedFunction)
            else choice
        )
        if request.parallel_tool_calls is not None:
            chat["parallel_tool_calls"] = request.parallel_tool_calls
    if request.logprobs:
        chat["logprobs"] = True
        if request.top_logprobs:
            chat["top_logprobs"] = request.top_logprobs
    for name, value in (
        ("max_tokens", request.max_output_tokens),
        ("temperature", request.temperature),
        ("top_p", request.top_p),
        ("user", request.user),
    ):
        if value is not None:
            chat[name] = value
    return ChatRequest(
        chat, msgspec.convert(chat, ChatCompletionRequest), tuple(sources), renamed=_CHAT_FIELD_NAMES
    )

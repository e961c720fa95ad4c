"""The conversation of a Responses request, as typed items: what `input` holds, what
`GET /v1/responses/{id}/input_items` lists, and the chat messages the pipeline is sent.

Three kinds of item: a message (its role as given, its text joined), an assistant's function call,
and the client's output of one. In chat messages, function calls in a row, with the assistant
messages among them (the one right before them, typically), are one assistant message with
`tool_calls`; an output is a `tool` message answering its call's id. Which call an output answers
is the upstream's to check, as the chat door leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol import InvalidRequestError

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text"})
_ITEM_STATUSES = frozenset({"in_progress", "completed", "incomplete"})


@dataclass(frozen=True)
class InputMessage:
    role: str  # user, assistant, system or developer, as the client said it
    text: str


@dataclass(frozen=True)
class FunctionCall:
    """A call the model made (replayed from an earlier response, or sent back by the client)."""

    call_id: str
    name: str
    arguments: str
    id: str | None = None  # the item's own id (`fc_...`), when it has one


@dataclass(frozen=True)
class FunctionCallOutput:
    """The client's result of the call `call_id`: a string, or the texts of its input_text parts."""

    call_id: str
    output: str | tuple[str, ...]
    id: str | None = None

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(self.output)


InputItem = InputMessage | FunctionCall | FunctionCallOutput


def unsupported(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{what} is not supported: Meridian's Responses API serves text and function tools "
        "(input messages, function calls and their outputs; instructions, max_output_tokens, "
        "temperature, top_p, stream, background, metadata, user, store, previous_response_id, "
        "tools of type 'function', tool_choice, parallel_tool_calls, include, top_logprobs).",
        param=param,
        code="unsupported_parameter",
    )


def _parts_text(content: Any, param: str, kinds: frozenset[str]) -> tuple[str, ...]:
    if not isinstance(content, list):
        raise InvalidRequestError("must be a string or a list of input_text parts.", param=param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in kinds:  # a JSON object is no set member
            raise unsupported(f"{param}[{j}]", f"A content part of type {kind!r}")
        if not isinstance(part.get("text"), str):
            raise InvalidRequestError("must be a string.", param=f"{param}[{j}].text")
        texts.append(part["text"])
    return tuple(texts)


def _string(item: dict[str, Any], name: str, param: str, *, empty: bool = False) -> str:
    value = item.get(name)
    if not isinstance(value, str) or (not value and not empty):
        raise InvalidRequestError(
            f"'{name}' must be a {'' if empty else 'non-empty '}string.", param=f"{param}.{name}"
        )
    return value


def _item_id_and_status(item: dict[str, Any], param: str) -> str | None:
    """An item's optional `id` (kept, for the listing) and `status` (checked, then dropped)."""
    item_id, status = item.get("id"), item.get("status")
    if item_id is not None and not isinstance(item_id, str):
        raise InvalidRequestError("'id' must be a string.", param=f"{param}.id")
    if status is not None and (not isinstance(status, str) or status not in _ITEM_STATUSES):
        raise InvalidRequestError(
            "'status' must be one of in_progress, completed, incomplete.", param=f"{param}.status"
        )
    return item_id


def _item(item: Any, param: str) -> InputItem:
    if not isinstance(item, dict):
        raise InvalidRequestError("must be an input item object.", param=param)
    kind = item.get("type", "message")
    if kind == "function_call":
        item_id = _item_id_and_status(item, param)
        return FunctionCall(
            call_id=_string(item, "call_id", param),
            name=_string(item, "name", param),
            arguments=_string(item, "arguments", param, empty=True),
            id=item_id,
        )
    if kind == "function_call_output":
        item_id = _item_id_and_status(item, param)
        output = item.get("output")
        if not isinstance(output, str):
            # Images and files a tool returns are not served: only its text.
            output = _parts_text(output, f"{param}.output", frozenset({"input_text"}))
        return FunctionCallOutput(call_id=_string(item, "call_id", param), output=output, id=item_id)
    if kind != "message":
        raise unsupported(param, f"An input item of type {kind!r}")
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidRequestError(
            "'role' must be one of user, assistant, system, developer.", param=f"{param}.role"
        )
    content = item.get("content")
    text = (
        content
        if isinstance(content, str)
        else "".join(_parts_text(content, f"{param}.content", _TEXT_PARTS))
    )
    return InputMessage(role, text)


def parse_input(value: Any) -> tuple[InputItem, ...]:
    """`input`: a string (one user message) or a non-empty list of items; a 400 naming the field."""
    if isinstance(value, str):
        return (InputMessage("user", value),)
    if not isinstance(value, list) or not value:
        raise InvalidRequestError("'input' must be a string or a non-empty list of items.", param="input")
    return tuple(_item(item, f"input[{i}]") for i, item in enumerate(value))


def _assistant_side(item: InputItem) -> bool:
    return isinstance(item, FunctionCall) or (isinstance(item, InputMessage) and item.role == "assistant")


def chat_messages(
    items: tuple[InputItem, ...], sources: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages of `items`, and the request field each came from (`sources[i]` is item
    i's: `input[i]`, or `previous_response_id` for the earlier conversation), so that an error
    naming a chat message can name what the client sent instead.

    Function calls and the assistant messages around them (items in a row with no other between)
    are one assistant turn: its text, then its calls. Chat APIs want a call's result right after
    the turn that called it, and a response whose text output safety held until the end lists its
    message after the calls it made (output.py): given back as input, they are still one turn."""
    messages: list[dict[str, Any]] = []
    came_from: list[str] = []
    start = 0
    while start < len(items):
        end = start
        while end < len(items) and _assistant_side(items[end]):
            end += 1
        calls = [
            (item, source)
            for item, source in zip(items[start:end], sources[start:end], strict=True)
            if isinstance(item, FunctionCall)
        ]
        if calls:
            text = "".join(item.text for item in items[start:end] if isinstance(item, InputMessage))
            tool_calls = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call, _ in calls
            ]
            messages.append({"role": "assistant", "content": text or None, "tool_calls": tool_calls})
            came_from.append(calls[0][1])  # a tool-calling error is about the calls
            start = end
            continue
        end = max(end, start + 1)  # each message of a run without calls, or one other item
        for item, source in zip(items[start:end], sources[start:end], strict=True):
            if isinstance(item, InputMessage):
                messages.append({"role": _ROLES[item.role], "content": item.text})
            else:
                assert isinstance(item, FunctionCallOutput)
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
            came_from.append(source)
        start = end
    return messages, came_from


def listed(items: tuple[InputItem, ...], stem: str) -> list[dict[str, Any]]:
    """The items as `input_items` lists them, oldest first, each with an id: its own, or one of
    its response's that every read gives alike."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if isinstance(item, InputMessage):
            part_type = "output_text" if item.role == "assistant" else "input_text"
            part: dict[str, Any] = {"type": part_type, "text": item.text}
            if part_type == "output_text":
                part.update(annotations=[], logprobs=[])
            out.append(
                {
                    "type": "message",
                    "id": f"msg_{stem}_in{i}",
                    "status": "completed",
                    "role": item.role,
                    "content": [part],
                }
            )
        elif isinstance(item, FunctionCall):
            out.append(
                {
                    "type": "function_call",
                    "id": item.id or f"fc_{stem}_in{i}",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                    "status": "completed",
                }
            )
        else:
            output: str | list[dict[str, Any]] = (
                item.output
                if isinstance(item.output, str)
                else [{"type": "input_text", "text": text} for text in item.output]
            )
            out.append(
                {
                    "type": "function_call_output",
                    "id": item.id or f"fco_{stem}_in{i}",
                    "call_id": item.call_id,
                    "output": output,
                    "status": "completed",
                }
            )
    return out

"""Anthropic Messages requests → OpenAI chat requests. Pure.

The `/v1/messages` front door (and its count door) turns its clients' requests into the chat
requests the pipeline serves here, client tools included:

- a tool becomes a function tool (`input_schema` its `parameters`); `tool_choice` auto, any,
  tool and none become "auto", "required", the named function and "none", and
  `disable_parallel_tool_use` becomes `parallel_tool_calls: false`;
- an assistant's `tool_use` blocks become its message's `tool_calls` (after its text, which
  becomes `content`);
- a user's `tool_result` blocks become one `tool` message each, in order, before the rest of the
  user's text (a user message of its own, if any). OpenAI's tool messages have no error flag: a
  result with `is_error` is sent as `TOOL_ERROR_PREFIX` + its text, so the model still reads that
  the call failed.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from msgspec import UNSET

from gateway.translate.chat_request import ChatRequest
from gateway.translate.errors import TranslationError
from protocol import ChatCompletionRequest
from protocol.anthropic import (
    AssistantMessage,
    MessagesRequest,
    TextBlock,
    Tool,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)

TOOL_ERROR_PREFIX = "Tool error: "
_TOOL_CHOICE_TO_OPENAI = {"auto": "auto", "any": "required", "none": "none"}


def _text(blocks: list[TextBlock]) -> str:
    return "".join(block.text for block in blocks)


def _tools(tools: list[Tool]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (UNSET, "custom"):
            raise TranslationError(
                f"`tools[{i}].type` {tool.type!r} is a server tool, which is not supported; only "
                "client tools are (type 'custom', or none given).",
                param=f"tools[{i}].type",
            )
        if tool.input_schema is UNSET:
            raise TranslationError(
                f"`tools[{i}].input_schema` is required of a client tool.", param=f"tools[{i}].input_schema"
            )
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.input_schema
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: ToolChoice) -> dict[str, Any]:
    """The chat fields for `choice` in a request with tools. Whether a named tool is one of them
    is the upstream's to say, as it is for every other detail of a tool."""
    fields: dict[str, Any] = {}
    if choice.type == "tool":
        if choice.name is None:
            raise TranslationError(
                "`tool_choice.name` is required when its type is 'tool'.", param="tool_choice.name"
            )
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        fields["tool_choice"] = _TOOL_CHOICE_TO_OPENAI[choice.type]
    # With "none" no tool is called, so there is nothing to run in parallel.
    if choice.disable_parallel_tool_use and choice.type != "none":
        fields["parallel_tool_calls"] = False
    return fields


def _tools_fields(request: MessagesRequest) -> dict[str, Any]:
    if not request.tools:
        choice = request.tool_choice
        if choice is not None and choice.type in ("any", "tool"):
            raise TranslationError(
                f"`tool_choice` of type {choice.type!r} needs `tools` to choose from.", param="tool_choice"
            )
        return {}  # auto or none without tools asks for nothing
    fields: dict[str, Any] = {"tools": _tools(request.tools)}
    if request.tool_choice is not None:
        fields.update(_tool_choice(request.tool_choice))
    return fields


def _tool_result_text(block: ToolResultBlock) -> str:
    content = block.content
    text = content if isinstance(content, str) else _text(content or [])
    if block.is_error:
        return TOOL_ERROR_PREFIX + text
    return text


def _user_messages(message: UserMessage, where: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A user turn (at `where`): its tool results as tool messages, then its text, if any, as a
    user message; with the field each came from."""
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}], [where]
    results, sources = [], []
    for index, block in enumerate(message.content):
        if isinstance(block, ToolResultBlock):
            results.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": _tool_result_text(block)}
            )
            sources.append(f"{where}.content[{index}]")
    text = _text([block for block in message.content if isinstance(block, TextBlock)])
    if text or not results:
        results.append({"role": "user", "content": text})
        sources.append(where)
    return results, sources


def _assistant_message(message: AssistantMessage) -> dict[str, Any]:
    """An assistant turn: its text as content, its tool_use blocks as tool calls."""
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    text = _text([block for block in message.content if isinstance(block, TextBlock)])
    calls = [
        {
            "id": block.id,
            "type": "function",
            # Not \u-escaped: input safety reads earlier calls' arguments as conversation text.
            "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)},
        }
        for block in message.content
        if isinstance(block, ToolUseBlock)
    ]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def messages_request_to_chat(request: MessagesRequest) -> ChatRequest:
    """`request` as a chat request, each chat message's source its turn (`messages[i]`), or the
    tool result block it came from (`messages[i].content[j]`), or `system`."""
    if request.thinking is not None and request.thinking.type != "disabled":
        # Dropped silently, it would answer another question than the one asked: refused by name.
        raise TranslationError(
            "Extended thinking is not supported; omit `thinking` or set its type to 'disabled'.",
            param="thinking",
        )
    messages: list[dict[str, Any]] = []
    sources: list[str] = []
    if request.system:
        system = request.system if isinstance(request.system, str) else _text(request.system)
        messages.append({"role": "system", "content": system})
        sources.append("system")
    for index, message in enumerate(request.messages):
        if isinstance(message, UserMessage):
            turn, turn_sources = _user_messages(message, f"messages[{index}]")
            messages.extend(turn)
            sources.extend(turn_sources)
        else:
            messages.append(_assistant_message(message))
            sources.append(f"messages[{index}]")
    body: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens}
    body.update(_tools_fields(request))
    if messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
        # Anthropic's prefill: the answer goes on from the last assistant message's text, not in a
        # new turn (vLLM's and our nodes' chat template fields; an Anthropic provider gets the
        # message back as it was, and an OpenAI one, which has no prefill, loses the two fields).
        # A last message of tool calls is not text to go on from: its upstream answers for it.
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    if request.stop_sequences:
        body["stop"] = list(request.stop_sequences)
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.metadata is not None and request.metadata.user_id:
        body["user"] = request.metadata.user_id
    if request.stream:
        # Usage arrives in a last chunk only when asked for; message_delta needs it.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return ChatRequest(body, msgspec.convert(body, ChatCompletionRequest), tuple(sources))

"""OpenAI chat requests → Anthropic Messages requests. Pure.

The Anthropic adapter turns our OpenAI-format requests into Messages requests here, tool calling
included (tools, `tool_choice`, `parallel_tool_calls`, tool calls and tool messages). The front
door's answers go the same direction in openai_to_anthropic_answers.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from gateway.translate.errors import TranslationError


def _part_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise TranslationError(
                    f"content part of type {kind!r} is not supported", param=f"{where}[{i}]"
                )
            texts.append(str(part.get("text") or ""))
        return "".join(texts)
    raise TranslationError("content must be a string or a list of parts", param=where)


def _refuse_what_would_change_the_answer(body: dict[str, Any]) -> None:
    """Fields the Messages API cannot express. Dropped silently, they would answer another
    question (free text where a JSON schema was asked for, no bias, no audio): refused by name,
    so the gateway fails over to a target that can serve them."""
    response_format = body.get("response_format")
    modalities = body.get("modalities") or []
    refused = {
        "response_format": response_format is not None
        and (not isinstance(response_format, dict) or response_format.get("type") != "text"),
        "logit_bias": bool(body.get("logit_bias")),
        "presence_penalty": body.get("presence_penalty") not in (None, 0),
        "frequency_penalty": body.get("frequency_penalty") not in (None, 0),
        "functions": bool(body.get("functions")),
        # "none" and "auto" ask for nothing without `functions` (refused above when given).
        "function_call": body.get("function_call") not in (None, "none", "auto"),
        "audio": body.get("audio") is not None,
        "modalities": any(modality != "text" for modality in modalities),
        "web_search_options": body.get("web_search_options") is not None,
        "logprobs": bool(body.get("logprobs")),
    }
    for name, is_refused in refused.items():
        if is_refused:
            raise TranslationError(f"`{name}` is not supported by the Messages API", param=name)


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = []
    for i, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind != "function":
            raise TranslationError(f"tools of type {kind!r} are not supported", param=f"tools[{i}].type")
        function = tool.get("function") or {}
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise TranslationError("a function tool needs a name", param=f"tools[{i}].function.name")
        entry: dict[str, Any] = {"name": name}
        if function.get("description"):
            entry["description"] = function["description"]
        # input_schema is required; OpenAI's parameters are optional (a function of no arguments).
        entry["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
        # Both APIs' `strict`: the call's input is guaranteed to follow the schema. Dropped, the
        # client would trust inputs nothing checked.
        if function.get("strict") is not None:
            entry["strict"] = bool(function["strict"])
        tools.append(entry)
    return tools


_TOOL_CHOICE_TYPES = {"auto": "auto", "none": "none", "required": "any"}


def _tool_choice(body: dict[str, Any]) -> dict[str, Any] | None:
    choice = body.get("tool_choice")
    out: dict[str, Any] | None
    if choice is None:
        out = None
    elif isinstance(choice, str) and choice in _TOOL_CHOICE_TYPES:
        out = {"type": _TOOL_CHOICE_TYPES[choice]}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise TranslationError("tool_choice names no function", param="tool_choice.function.name")
        out = {"type": "tool", "name": name}
    else:
        raise TranslationError(f"tool_choice {choice!r} is not supported", param="tool_choice")
    if body.get("parallel_tool_calls") is False:
        out = out or {"type": "auto"}
        if out["type"] != "none":  # Anthropic's "none" takes no such flag: it calls no tool at all
            out["disable_parallel_tool_use"] = True
    return out


# The Messages API's pattern for a tool_use block's id. OpenAI's are `call_…`, but clients and
# other OpenAI-compatible upstreams send others (`functions.get_weather:0`, ids with dots).
_ANTHROPIC_TOOL_ID = re.compile(r"[A-Za-z0-9_-]+")


def _tool_id(call_id: str) -> str:
    """`call_id` as the Messages API takes it: as it is when it fits the pattern, else with each
    character outside it replaced and a hash of the whole appended, so that two ids never become
    one. The same on both sides, so a tool_result still answers its tool_use; the answer's calls
    are the provider's own ids, so nothing needs mapping back."""
    if _ANTHROPIC_TOOL_ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return re.sub(r"[^A-Za-z0-9_-]", "_", call_id) + "_" + digest


def _tool_uses(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls as tool_use blocks."""
    blocks = []
    for j, call in enumerate(message.get("tool_calls") or []):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function":
            raise TranslationError("only function tool calls are supported", param=f"{at}.type")
        function = call.get("function") or {}
        call_id, name = call.get("id"), function.get("name")
        if not isinstance(call_id, str) or not call_id:
            raise TranslationError("a tool call needs an id", param=f"{at}.id")
        if not isinstance(name, str) or not name:
            raise TranslationError("a tool call needs a function name", param=f"{at}.function.name")
        arguments = function.get("arguments")
        try:
            tool_input = json.loads(arguments) if arguments not in (None, "") else {}
        except (TypeError, ValueError):
            tool_input = None
        if not isinstance(tool_input, dict):
            raise TranslationError(
                "tool call arguments must be a JSON object", param=f"{at}.function.arguments"
            )
        blocks.append({"type": "tool_use", "id": _tool_id(call_id), "name": name, "input": tool_input})
    return blocks


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    tool_call_id = message.get("tool_call_id")
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise TranslationError("a tool message needs a tool_call_id", param=f"{where}.tool_call_id")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _tool_id(tool_call_id)}
    text = _part_text(message.get("content"), f"{where}.content")
    if text:  # content is optional in a tool_result, and empty text blocks are refused
        block["content"] = text
    return block


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add blocks to the conversation, merging into the last turn when it has the same role."""
    if not blocks:
        return
    if not turns or turns[-1]["role"] != role:
        turns.append({"role": role, "content": []})
    content: list[dict[str, Any]] = turns[-1]["content"]
    for block in blocks:
        if block["type"] == "tool_result":
            # Anthropic requires a user turn's tool results before any of its text.
            at = next((k for k, old in enumerate(content) if old["type"] != "tool_result"), len(content))
            content.insert(at, block)
        else:
            content.append(block)


def chat_to_messages(body: dict[str, Any], *, model: str, default_max_tokens: int) -> dict[str, Any]:
    """An OpenAI chat request as a Messages request for `model` (the provider's model name).

    System and developer messages, wherever they are, become `system`. Consecutive messages of
    one role become one message with a block each, keeping user/assistant alternation: an
    assistant's tool calls become tool_use blocks after its text, tool messages tool_result
    blocks in a user turn. Empty text is dropped: the Messages API refuses empty text blocks.
    """
    if int(body.get("n") or 1) != 1:
        raise TranslationError("n > 1 is not supported", param="n")
    _refuse_what_would_change_the_answer(body)
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        where = f"messages[{i}]"
        if role == "tool":
            _append(turns, "user", [_tool_result(message, where)])
            continue
        text = _part_text(message.get("content"), f"{where}.content")
        if role in ("system", "developer"):
            if text:
                system.append(text)
            continue
        if role not in ("user", "assistant"):
            raise TranslationError(f"messages with role {role!r} are not supported", param=f"{where}.role")
        blocks = [{"type": "text", "text": text}] if text else []
        if role == "assistant":
            blocks += _tool_uses(message, where)
        _append(turns, role, blocks)
    if not turns:
        raise TranslationError(
            "at least one non-empty user or assistant message is required", param="messages"
        )
    for turn in turns:
        if len(turn["content"]) == 1 and turn["content"][0]["type"] == "text":
            turn["content"] = turn["content"][0]["text"]

    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    out: dict[str, Any] = {"model": model, "max_tokens": int(max_tokens), "messages": turns}
    if system:
        out["system"] = "\n\n".join(system)
    tools = _tools(body)
    if tools:
        out["tools"] = tools
        tool_choice = _tool_choice(body)
        if tool_choice is not None:
            out["tool_choice"] = tool_choice
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("temperature") is not None:
        # OpenAI's range is 0..2, Anthropic's 0..1: clamp rather than fail a fallback request.
        out["temperature"] = min(max(float(body["temperature"]), 0.0), 1.0)
    for name in ("top_p", "top_k"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("user"):
        out["metadata"] = {"user_id": str(body["user"])}
    if body.get("stream"):
        out["stream"] = True
    return out

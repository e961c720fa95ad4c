"""Anthropic Messages answers → OpenAI chat answers. Pure.

The Anthropic adapter turns an Anthropic upstream's message (and its stop reason, usage, tool_use
blocks) into OpenAI's chat response here; its stream (gateway/upstreams/providers/
anthropic_stream.py) uses the same stop reason, usage and tool argument mappings.
"""

from __future__ import annotations

import json
from typing import Any

STOP_REASON_TO_FINISH: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "content_filter",
}


def usage_to_openai(usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic counts cached prompt tokens apart from `input_tokens`; OpenAI's prompt_tokens
    includes them, with the cache hits repeated in prompt_tokens_details.cached_tokens."""
    cached = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def finish_reason(stop_reason: str | None) -> str | None:
    if stop_reason is None:
        return None
    return STOP_REASON_TO_FINISH.get(stop_reason, "stop")


def matched_stop(stop_reason: str | None, stop_sequence: Any) -> dict[str, str]:
    """The matched stop string, vLLM-style (`stop_reason`), so the /v1/messages front door can
    answer `stop_sequence` when an Anthropic provider served (OpenAI's "stop" alone cannot say)."""
    if stop_reason == "stop_sequence" and isinstance(stop_sequence, str):
        return {"stop_reason": stop_sequence}
    return {}


def tool_arguments(tool_input: Any) -> str:
    """A tool_use block's input as OpenAI's `arguments` string. Non-ASCII stays as it is, not
    \\u-escaped: output safety reads the arguments as model text."""
    return json.dumps(tool_input if tool_input is not None else {}, ensure_ascii=False)


def messages_to_chat_response(message: dict[str, Any], *, model: str, created: int) -> dict[str, Any]:
    blocks = message.get("content") or []
    text = "".join(str(block.get("text") or "") for block in blocks if block.get("type") == "text")
    tool_calls = [
        {
            "id": str(block.get("id", "")),
            "type": "function",
            "function": {"name": str(block.get("name", "")), "arguments": tool_arguments(block.get("input"))},
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": text if text or not tool_calls else None}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": reply,
        "finish_reason": finish_reason(message.get("stop_reason")),
        "logprobs": None,
    }
    choice.update(matched_stop(message.get("stop_reason"), message.get("stop_sequence")))
    return {
        "id": str(message.get("id", "")),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_to_openai(message.get("usage") or {}),
    }

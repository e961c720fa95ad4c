"""Anthropic Messages → OpenAI chat. Pure.

The `/v1/messages` front door turns its clients' requests into chat requests here; the Anthropic
adapter turns an Anthropic upstream's answers (and stop reasons, usage) into OpenAI's shapes.
"""

from __future__ import annotations

from typing import Any

from gateway.translate.errors import TranslationError
from protocol.anthropic import ContentBlock, MessagesRequest

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


def messages_to_chat_response(message: dict[str, Any], *, model: str, created: int) -> dict[str, Any]:
    text = "".join(
        str(block.get("text") or "") for block in message.get("content") or [] if block.get("type") == "text"
    )
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
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


def _blocks_text(content: str | list[ContentBlock], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content):
        if block.type != "text":
            raise TranslationError(
                f"content blocks of type {block.type!r} are not supported", param=f"{where}[{i}]"
            )
        texts.append(block.text or "")
    return "".join(texts)


def _refuse_what_would_change_the_answer(request: MessagesRequest) -> None:
    """Dropped silently, these would answer another question than the one asked (a model told
    of tools, or to think first): a 400 naming them, as the OpenAI door's nodes refuse tools."""
    if request.tools:
        raise TranslationError("Tool use is not supported; omit `tools`.", param="tools")
    if request.tool_choice is not None and request.tool_choice.type not in ("auto", "none"):
        raise TranslationError(
            f"tool_choice {request.tool_choice.type!r} needs tools, which are not supported; "
            "omit `tool_choice`.",
            param="tool_choice",
        )
    if request.thinking is not None and request.thinking.type != "disabled":
        raise TranslationError(
            "Extended thinking is not supported; omit `thinking` or set its type to 'disabled'.",
            param="thinking",
        )


def messages_request_to_chat(request: MessagesRequest) -> dict[str, Any]:
    _refuse_what_would_change_the_answer(request)
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": _blocks_text(request.system, "system")})
    for i, message in enumerate(request.messages):
        messages.append(
            {"role": message.role, "content": _blocks_text(message.content, f"messages[{i}].content")}
        )
    body: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens}
    if request.messages[-1].role == "assistant":
        # Anthropic's prefill: the answer goes on from the last assistant message's text, not in a
        # new turn (vLLM's and our nodes' chat template fields; an Anthropic provider gets the
        # message back as it was, and an OpenAI one, which has no prefill, loses the two fields).
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
    return body


# -- OpenAI chat response -> Messages response (the front door) ------------------------------------

"""OpenAI chat <-> Anthropic Messages translation of requests and whole responses. Pure.

Used both ways: the Anthropic adapter turns our OpenAI-format requests into Messages requests
and the answers back; the `/v1/messages` front door does the opposite for Anthropic clients.
Streams are in anthropic_stream. The mapping table is in gateway/upstreams/providers/README.md.
"""

from __future__ import annotations

from typing import Any

from protocol.anthropic import ContentBlock, MessagesRequest

STOP_REASON_TO_FINISH: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "content_filter",
}
FINISH_TO_STOP_REASON: dict[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


class TranslationError(Exception):
    """The request cannot be expressed in the other API (e.g. tool messages, images)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# -- OpenAI chat request -> Messages request (the Anthropic adapter) -------------------------------


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


def chat_to_messages(body: dict[str, Any], *, model: str, default_max_tokens: int) -> dict[str, Any]:
    """An OpenAI chat request as a Messages request for `model` (the provider's model name).

    System and developer messages, wherever they are, become `system`. Consecutive messages of
    one role become one message with a text block each, keeping user/assistant alternation.
    Empty messages are dropped: the Messages API refuses empty text blocks.
    """
    if int(body.get("n") or 1) != 1:
        raise TranslationError("n > 1 is not supported", param="n")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(body.get("messages") or []):
        role = message.get("role")
        text = _part_text(message.get("content"), f"messages[{i}].content")
        if role in ("system", "developer"):
            if text:
                system.append(text)
            continue
        if role not in ("user", "assistant"):
            raise TranslationError(
                f"messages with role {role!r} are not supported", param=f"messages[{i}].role"
            )
        if not text:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].append({"type": "text", "text": text})
        else:
            turns.append({"role": role, "content": [{"type": "text", "text": text}]})
    if not turns:
        raise TranslationError(
            "at least one non-empty user or assistant message is required", param="messages"
        )
    for turn in turns:
        if len(turn["content"]) == 1:
            turn["content"] = turn["content"][0]["text"]

    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    out: dict[str, Any] = {"model": model, "max_tokens": int(max_tokens), "messages": turns}
    if system:
        out["system"] = "\n\n".join(system)
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


# -- Messages response -> OpenAI chat response (the Anthropic adapter) -----------------------------


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


# -- Messages request -> OpenAI chat request (the front door) --------------------------------------


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


def messages_request_to_chat(request: MessagesRequest) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": _blocks_text(request.system, "system")})
    for i, message in enumerate(request.messages):
        messages.append(
            {"role": message.role, "content": _blocks_text(message.content, f"messages[{i}].content")}
        )
    if request.max_tokens < 1:
        raise TranslationError("max_tokens must be at least 1", param="max_tokens")
    body: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens}
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


def usage_to_anthropic(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": max(int(usage.get("prompt_tokens") or 0) - cached, 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def stop_reason(choice: dict[str, Any], stop_sequences: list[str] | None) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for an OpenAI choice. OpenAI's "stop" does not say whether a
    stop string matched; nodes that report the matched string vLLM-style (`stop_reason`) let
    us answer "stop_sequence", otherwise it is "end_turn"."""
    finish = choice.get("finish_reason")
    if finish is None:
        return None, None
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    return FINISH_TO_STOP_REASON.get(finish, "end_turn"), None


def message_id(chat_id: str) -> str:
    return "msg_" + chat_id.removeprefix("chatcmpl-")


def chat_response_to_message(
    response: dict[str, Any], *, stop_sequences: list[str] | None = None
) -> dict[str, Any]:
    choice = (response.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    reason, sequence = stop_reason(choice, stop_sequences)
    return {
        "id": message_id(str(response.get("id", ""))),
        "type": "message",
        "role": "assistant",
        "model": response.get("model", ""),
        "content": [{"type": "text", "text": text}],
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_to_anthropic(response.get("usage")),
    }

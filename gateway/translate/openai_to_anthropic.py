"""OpenAI chat → Anthropic Messages. Pure.

The Anthropic adapter turns our OpenAI-format requests into Messages requests here; the
`/v1/messages` front door turns the pipeline's answers and chunks into Anthropic's message and
event stream.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.translate.errors import TranslationError
from protocol.chunk import Chunk, usage_of

FINISH_TO_STOP_REASON: dict[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}

# (event name, data) as the front door writes them: `event: NAME` + `data: JSON`.
Event = tuple[str, dict[str, Any]]


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


class ChatToMessagesStream:
    """OpenAI chunks from the pipeline -> Anthropic events (the `/v1/messages` front door).

    There is one text block, opened right after message_start. Usage arrives last (OpenAI
    puts it in a chunk after the finish_reason), so message_delta is written by `finish`.
    """

    def __init__(self, *, message_id: str, model: str, stop_sequences: list[str] | None = None) -> None:
        self._message_id = message_id
        self._model = model
        self._stop_sequences = stop_sequences
        self._stop: tuple[str | None, str | None] = (None, None)
        self._usage: dict[str, Any] | None = None

    def start(self, input_tokens: int = 0) -> list[Event]:
        message = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        }
        return [
            ("message_start", {"type": "message_start", "message": message}),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            ("ping", {"type": "ping"}),
        ]

    def feed(self, chunk: Chunk) -> list[Event]:
        usage = usage_of(chunk.usage)
        if usage is not None:
            self._usage = msgspec.to_builtins(usage)
        events: list[Event] = []
        for choice in chunk.choices:
            text = choice.content()
            if text:
                delta = {"type": "text_delta", "text": text}
                events.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
                )
            if choice.finish_reason is not None:
                self._stop = stop_reason(
                    {"finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason or None},
                    self._stop_sequences,
                )
        return events

    def close_block(self) -> Event:
        return ("content_block_stop", {"type": "content_block_stop", "index": 0})

    def finish(self) -> list[Event]:
        """The stream ended with its finish (the pipeline guarantees one, or ends with an error)."""
        reason, sequence = self._stop
        usage = usage_to_anthropic(self._usage)
        return [
            self.close_block(),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage,
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]

    @staticmethod
    def error(error_type: str, message: str) -> Event:
        return ("error", {"type": "error", "error": {"type": error_type, "message": message}})

"""Streaming translation between Anthropic's event sequence and OpenAI chunks, both ways. Pure.

Anthropic: message_start, then per content block content_block_start / content_block_delta* /
content_block_stop, then message_delta (stop_reason, cumulative usage) and message_stop, with
ping events anywhere and an `error` event when the stream fails after it began.
OpenAI: chunks with a `delta`; the first carries the role, the last choice chunk the
finish_reason, and with stream_options.include_usage a final chunk with no choices and usage.
"""

from __future__ import annotations

from typing import Any

from gateway.upstreams.providers.anthropic_errors import anthropic_stream_error
from gateway.upstreams.providers.anthropic_translate import (
    finish_reason,
    matched_stop,
    stop_reason,
    usage_to_anthropic,
    usage_to_openai,
)
from gateway.upstreams.providers.errors import ProviderError

# (event name, data) as the front door writes them: `event: NAME` + `data: JSON`.
Event = tuple[str, dict[str, Any]]


class MessagesToChatStream:
    """Anthropic events from a provider -> OpenAI chunk dicts (the Anthropic adapter)."""

    def __init__(self, *, provider: str, model: str, created: int, include_usage: bool) -> None:
        self._provider = provider
        self._model = model
        self._created = created
        self._include_usage = include_usage
        self._id = ""
        self._usage: dict[str, Any] = {}
        self.finished = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    def feed(self, event_type: str | None, data: dict[str, Any]) -> list[dict[str, Any]]:
        """Chunks for one event. `event_type` is the SSE `event:` field; the data's own `type`
        is used when it is missing (the two always agree in Anthropic's streams)."""
        kind = data.get("type") or event_type
        if kind == "message_start":
            message = data.get("message") or {}
            self._id = str(message.get("id", ""))
            self._usage.update(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            text = block.get("text") if block.get("type") == "text" else None
            return [self._chunk({"content": text})] if text else []
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            # thinking, signature and tool-input deltas have no place in a chat message
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [self._chunk({"content": delta["text"]})]
            return []
        if kind == "message_delta":
            # Its usage counts are cumulative: they replace, not add to, message_start's.
            self._usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            delta = data.get("delta") or {}
            reason = delta.get("stop_reason")
            chunk = self._chunk({}, finish_reason(reason) or "stop")
            chunk["choices"][0].update(matched_stop(reason, delta.get("stop_sequence")))
            return [chunk]
        if kind == "message_stop":
            self.finished = True
            if not self._include_usage:
                return []
            final = self._chunk({})
            final["choices"] = []
            final["usage"] = usage_to_openai(self._usage)
            return [final]
        if kind == "error":
            raise anthropic_stream_error(self._provider, data)
        return []  # ping, content_block_stop, and event types added after this was written

    def end(self) -> None:
        """The body ended: without message_stop, the stream broke."""
        if not self.finished:
            raise ProviderError(f"{self._provider}: stream ended before message_stop", kind="stream_broken")


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

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        events: list[Event] = []
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                delta = {"type": "text_delta", "text": text}
                events.append(
                    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
                )
            if choice.get("finish_reason") is not None:
                self._stop = stop_reason(choice, self._stop_sequences)
        return events

    def finish(self) -> list[Event]:
        reason, sequence = self._stop
        usage = usage_to_anthropic(self._usage)
        return [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason or "end_turn", "stop_sequence": sequence},
                    "usage": usage,
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]

    @staticmethod
    def error(error_type: str, message: str) -> Event:
        return ("error", {"type": "error", "error": {"type": error_type, "message": message}})

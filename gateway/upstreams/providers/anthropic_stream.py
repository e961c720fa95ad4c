"""An Anthropic upstream's event stream read as OpenAI chunks (the Anthropic adapter). Pure.

Anthropic: message_start, then per content block content_block_start / content_block_delta* /
content_block_stop, then message_delta (stop_reason, cumulative usage) and message_stop, with
ping events anywhere and an `error` event when the stream fails after it began.
OpenAI: chunks with a `delta`; the first carries the role, the last choice chunk the
finish_reason, and with stream_options.include_usage a final chunk with no choices and usage.
"""

from __future__ import annotations

from typing import Any

from gateway.translate.anthropic_to_openai import finish_reason, matched_stop, usage_to_openai
from gateway.upstreams.providers.anthropic_errors import anthropic_stream_error
from gateway.upstreams.providers.errors import ProviderError


class MessagesToChatStream:
    """Anthropic events from a provider -> OpenAI chunk dicts (the Anthropic adapter)."""

    def __init__(self, *, provider: str, model: str, created: int, include_usage: bool) -> None:
        self._provider = provider
        self._model = model
        self._created = created
        self._include_usage = include_usage
        self._id = ""
        self._usage: dict[str, Any] = {}
        self.finished = False  # a stop_reason arrived
        self.stopped = False  # message_stop arrived

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
            # Its usage counts are cumulative: they replace, not add to, message_start's. The
            # usage goes out here, not at message_stop: a stream that loses its message_stop
            # still reports what the upstream counted.
            self._usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            delta = data.get("delta") or {}
            reason = delta.get("stop_reason")
            out = []
            mapped = finish_reason(reason)
            if mapped is not None:  # a null stop_reason is no finish: none is invented
                chunk = self._chunk({}, mapped)
                chunk["choices"][0].update(matched_stop(reason, delta.get("stop_sequence")))
                out.append(chunk)
                self.finished = True
            if self._include_usage:
                final = self._chunk({})
                final["choices"] = []
                final["usage"] = usage_to_openai(self._usage)
                out.append(final)
            return out
        if kind == "message_stop":
            # The end of the events; whether the answer finished was said by message_delta (the
            # relay treats a stream without a finish_reason as broken).
            self.stopped = True
            return []
        if kind == "error":
            raise anthropic_stream_error(self._provider, data)
        return []  # ping, content_block_stop, and event types added after this was written

    def end(self) -> None:
        """The body ended: without message_stop or a stop_reason, the stream broke. (With a stop
        reason and its usage out, a lost message_stop loses nothing.)"""
        if not self.finished and not self.stopped:
            raise ProviderError(f"{self._provider}: stream ended before message_stop", kind="stream_broken")

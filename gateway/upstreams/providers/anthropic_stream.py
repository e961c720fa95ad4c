"""An Anthropic upstream's event stream read as OpenAI chunks (the Anthropic adapter). Pure.

Anthropic: message_start, then per content block content_block_start / content_block_delta* /
content_block_stop, then message_delta (stop_reason, cumulative usage) and message_stop, with
ping events anywhere and an `error` event when the stream fails after it began.
OpenAI: chunks with a `delta`; the first carries the role, the last choice chunk the
finish_reason, and with stream_options.include_usage a final chunk with no choices and usage.

A tool_use block is a tool call: its start gives the call's id and name, its input_json_delta
events the arguments in pieces. OpenAI numbers tool calls from 0 (`index`) among the message's
calls, Anthropic numbers all content blocks, so each tool_use block is given the next call index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.translate.anthropic_to_openai_answers import (
    finish_reason,
    matched_stop,
    tool_arguments,
    usage_to_openai,
)
from gateway.upstreams.providers.anthropic_errors import anthropic_stream_error
from gateway.upstreams.providers.errors import ProviderError
from protocol.chunk import OPENED_USAGE_FIELD


@dataclass
class _ToolBlock:
    call_index: int  # OpenAI's `index` of this tool call
    start_input: Any  # the input the block opened with ({} in Anthropic's streams)
    streamed: bool = False  # some of its arguments went out


class MessagesToChatStream:
    """Anthropic events from a provider -> OpenAI chunk dicts (the Anthropic adapter)."""

    def __init__(self, *, provider: str, model: str, created: int, include_usage: bool) -> None:
        self._provider = provider
        self._model = model
        self._created = created
        self._include_usage = include_usage
        self._id = ""
        self._usage: dict[str, Any] = {}
        self._tools: dict[int, _ToolBlock] = {}  # by Anthropic content block index
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
            opening = self._chunk({"role": "assistant", "content": ""})
            if self._usage.get("input_tokens") is not None:  # the prompt's count, known at the start
                opening[OPENED_USAGE_FIELD] = usage_to_openai({**self._usage, "output_tokens": 0})
            return [opening]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                return [self._tool_start(data.get("index"), block)]
            text = block.get("text") if block.get("type") == "text" else None
            return [self._chunk({"content": text})] if text else []
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            # thinking and signature deltas have no place in a chat message
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [self._chunk({"content": delta["text"]})]
            tool = self._tools.get(data.get("index"))
            if delta.get("type") == "input_json_delta" and tool is not None and delta.get("partial_json"):
                tool.streamed = True
                return [self._tool_arguments(tool, str(delta["partial_json"]))]
            return []
        if kind == "content_block_stop":
            tool = self._tools.get(data.get("index"))
            if tool is not None and not tool.streamed:
                # A call with no input deltas (a tool without parameters) still needs arguments a
                # client can json.loads: OpenAI sends "{}" there, never "".
                tool.streamed = True
                return [self._tool_arguments(tool, tool_arguments(tool.start_input or {}))]
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
        return []  # ping, and event types added after this was written

    def _tool_start(self, block_index: Any, block: dict[str, Any]) -> dict[str, Any]:
        tool = _ToolBlock(call_index=len(self._tools), start_input=block.get("input"))
        self._tools[block_index] = tool
        function = {"name": str(block.get("name", "")), "arguments": ""}
        call = {
            "index": tool.call_index,
            "id": str(block.get("id", "")),
            "type": "function",
            "function": function,
        }
        return self._chunk({"tool_calls": [call]})

    def _tool_arguments(self, tool: _ToolBlock, arguments: str) -> dict[str, Any]:
        return self._chunk({"tool_calls": [{"index": tool.call_index, "function": {"arguments": arguments}}]})

    def end(self) -> None:
        """The body ended: without message_stop or a stop_reason, the stream broke. (With a stop
        reason and its usage out, a lost message_stop loses nothing.)"""
        if not self.finished and not self.stopped:
            raise ProviderError(f"{self._provider}: stream ended before message_stop", kind="stream_broken")

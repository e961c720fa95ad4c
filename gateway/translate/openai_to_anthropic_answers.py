"""OpenAI chat answers → Anthropic Messages answers. Pure.

The `/v1/messages` front door turns the pipeline's typed answer (protocol/chunk.py, after output
safety) into Anthropic's message, and its chunks into Anthropic's event stream, here. A message's
content is a text block (left out when the answer is only tool calls: Anthropic's own answers
have no empty text blocks) and a `tool_use` block per tool call, whose `input` is the call's
arguments read as JSON. Arguments that are not a JSON object cannot be a tool_use block's input:
the upstream's answer is refused (`UntranslatableAnswer`, a 502), never passed on half-read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET

from gateway.translate.errors import UntranslatableAnswer
from protocol.chunk import CONTENT, Chunk, ToolCall, Usage, tool_channel, usage_of

FINISH_TO_STOP_REASON: dict[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}

# (event name, data) as the front door writes them: `event: NAME` + `data: JSON`.
Event = tuple[str, dict[str, Any]]


def usage_to_anthropic(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": max(int(usage.get("prompt_tokens") or 0) - cached, 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def stop_reason(
    choice: dict[str, Any], stop_sequences: list[str] | None, *, called_tools: bool = False
) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for an OpenAI choice. OpenAI's "stop" does not say whether a
    stop string matched; nodes that report the matched string vLLM-style (`stop_reason`) let
    us answer "stop_sequence", otherwise it is "end_turn". An answer that ends with tool calls
    is "tool_use" even from an upstream that says "stop": Anthropic's clients run the tools on it."""
    finish = choice.get("finish_reason")
    if finish is None:
        return None, None
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    reason = FINISH_TO_STOP_REASON.get(finish, "end_turn")
    return ("tool_use" if called_tools and reason == "end_turn" else reason), None


def message_id(chat_id: str) -> str:
    return "msg_" + chat_id.removeprefix("chatcmpl-")


def tool_input(arguments: str) -> dict[str, Any] | None:
    """A tool call's arguments as a tool_use block's input: no arguments are {}; None when they
    are not a JSON object."""
    if not arguments:
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _invalid_arguments(name: str) -> str:
    return f"The upstream called the tool {name!r} with arguments that are not a JSON object."


def chat_response_to_message(
    response: dict[str, Any], *, stop_sequences: list[str] | None = None
) -> dict[str, Any]:
    """Raises UntranslatableAnswer for a tool call whose arguments are not a JSON object."""
    choice = (response.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    text = reply.get("content") or ""
    uses = []
    for call in reply.get("tool_calls") or []:
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        arguments = tool_input(str(function.get("arguments") or ""))
        if arguments is None:
            raise UntranslatableAnswer(_invalid_arguments(name))
        uses.append({"type": "tool_use", "id": str(call.get("id") or ""), "name": name, "input": arguments})
    content = [{"type": "text", "text": text}] if text or not uses else []
    reason, sequence = stop_reason(choice, stop_sequences, called_tools=bool(uses))
    return {
        "id": message_id(str(response.get("id", ""))),
        "type": "message",
        "role": "assistant",
        "model": response.get("model", ""),
        "content": content + uses,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_to_anthropic(response.get("usage")),
    }


@dataclass
class _Block:
    """One content block of the streamed message: the text, or one tool call (`key` is its text
    channel, protocol/chunk.py's CONTENT or `tool:N`)."""

    key: str
    start: dict[str, Any]  # the content_block of its content_block_start
    pending: list[str] = field(default_factory=list)  # pieces not written yet
    index: int | None = None  # its place in the message, once started
    arguments: str = ""  # a tool call's arguments: every piece, written or pending

    @property
    def is_tool(self) -> bool:
        return self.start["type"] == "tool_use"

    def delta(self, piece: str) -> dict[str, Any]:
        if self.is_tool:
            return {"type": "input_json_delta", "partial_json": piece}
        return {"type": "text_delta", "text": piece}

    @property
    def complete(self) -> bool:
        """Nothing more can belong to it: always true of text (more text goes into a new block);
        a tool call once its arguments are a whole JSON object."""
        if not self.is_tool:
            return True
        return self.arguments.rstrip().endswith("}") and tool_input(self.arguments) is not None


class ChatToMessagesStream:
    """OpenAI chunks from the pipeline -> Anthropic events (the `/v1/messages` front door).

    Anthropic's content blocks come one at a time, numbered from 0: each is started, given its
    deltas and stopped before the next starts. Text goes into a text block, opened with the first
    text; a tool call's arguments into a tool_use block, opened with its first arguments, as
    `input_json_delta` pieces. Pieces that belong to another block than the open one wait until
    the open block is complete: upstreams stream one block after another, but output safety holds
    each channel's last characters until it has checked them (gateway/safety/output.py), so a
    call's tail may come after the next call began. A tool call's block is complete when its
    arguments are a whole JSON object; text is complete whenever something else waits (text
    released later goes into a new text block). Usage arrives last (OpenAI puts it in a chunk
    after the finish_reason), so message_delta is written by `finish`.
    """

    def __init__(self, *, message_id: str, model: str, stop_sequences: list[str] | None = None) -> None:
        self._message_id = message_id
        self._model = model
        self._stop_sequences = stop_sequences
        self._finish: dict[str, Any] = {}
        self._usage: dict[str, Any] | None = None
        self._open: _Block | None = None
        self._waiting: list[_Block] = []  # blocks with pieces to write, in the order they came
        self._tools: dict[str, _Block] = {}  # every tool call, by channel
        self._started = 0  # blocks started so far: the next block's index

    def start(self, opened: Usage | None = None) -> list[Event]:
        """message_start (with the prompt's counts, where the upstream said them as the stream
        opened: clients such as Claude Code show a context's size from it) and a ping."""
        message = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_to_anthropic(msgspec.to_builtins(opened) if opened is not None else None),
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def feed(self, chunk: Chunk) -> list[Event]:
        usage = usage_of(chunk.usage)
        if usage is not None:
            self._usage = msgspec.to_builtins(usage)
        events: list[Event] = []
        for choice in chunk.choices:
            text = choice.content()
            if text:
                events += self._text(text)
            calls = choice.body.tool_calls if choice.body is not None else None
            for position, call in enumerate(calls or ()):
                events += self._tool_call(call, position)
            if choice.finish_reason is not None:
                self._finish = {
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason or None,
                }
        return events + self._advance()

    def finish(self) -> list[Event]:
        """The stream ended with its finish (the pipeline guarantees one, or ends with an error)."""
        events = self._flush()
        if self._started == 0:
            # An empty answer still has its text block, as the whole message has.
            events += self._begin(_Block(CONTENT, {"type": "text", "text": ""})) + self._end()
        invalid = next((tool for tool in self._tools.values() if tool_input(tool.arguments) is None), None)
        if invalid is not None:
            return [*events, self._error("api_error", _invalid_arguments(invalid.start["name"]))]
        reason, sequence = stop_reason(self._finish, self._stop_sequences, called_tools=bool(self._tools))
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_to_anthropic(self._usage),
        }
        return [*events, ("message_delta", message_delta), ("message_stop", {"type": "message_stop"})]

    def failed(self, error_type: str, message: str) -> list[Event]:
        """The end of a stream that could not finish: what passed is written and its blocks
        closed, then the error (no message_delta: no stop_reason is made up)."""
        return [*self._flush(), self._error(error_type, message)]

    # -- blocks ---------------------------------------------------------------------------------

    def _text(self, text: str) -> list[Event]:
        if self._open is not None and self._open.key == CONTENT:
            return [self._delta(self._open, text)]
        waiting = next((block for block in self._waiting if block.key == CONTENT), None)
        if waiting is None:
            waiting = _Block(CONTENT, {"type": "text", "text": ""})
            self._waiting.append(waiting)
        waiting.pending.append(text)
        return []

    def _tool_call(self, call: ToolCall, position: int) -> list[Event]:
        key = tool_channel(call, position)
        function = call.function if call.function is not UNSET else None
        block = self._tools.get(key)
        if block is None:
            start = {"type": "tool_use", "id": "", "name": "", "input": {}}
            block = self._tools[key] = _Block(key, start)
        if block.index is None:  # an upstream may name the call in a later piece than its first
            if isinstance(call.id, str) and call.id:
                block.start["id"] = call.id
            if function is not None and isinstance(function.name, str) and function.name:
                block.start["name"] = function.name
        arguments = function.arguments if function is not None else None
        if not isinstance(arguments, str) or not arguments:
            return []
        block.arguments += arguments
        if block is self._open:
            return [self._delta(block, arguments)]
        if block.index is None:
            block.pending.append(arguments)
            if block not in self._waiting:
                self._waiting.append(block)
        # else: arguments after its block was complete; they leave it invalid, which `finish` says.
        return []

    def _advance(self) -> list[Event]:
        """Start the waiting blocks, in order, while the open one is complete."""
        events: list[Event] = []
        while self._waiting and (self._open is None or self._open.complete):
            block = self._next()
            if block is None:
                break
            events += self._end() + self._begin(block)
        return events

    def _next(self) -> _Block | None:
        """The first waiting block that may start: text any time, a tool call once every call
        before it has started (the calls keep their order, as in the whole message)."""
        unstarted = [tool for tool in self._tools.values() if tool.index is None]
        for block in self._waiting:
            if not block.is_tool or block is unstarted[0]:
                self._waiting.remove(block)
                return block
        return None

    def _flush(self) -> list[Event]:
        """Everything still to write, each block started and stopped: the stream is over."""
        for tool in self._tools.values():
            if tool.index is None and tool not in self._waiting:
                self._waiting.append(tool)  # a call without arguments: input {}
        events: list[Event] = []
        while (block := self._next()) is not None:
            events += self._end() + self._begin(block)
        return events + self._end()

    def _begin(self, block: _Block) -> list[Event]:
        block.index = self._started
        self._started += 1
        self._open = block
        start = {"type": "content_block_start", "index": block.index, "content_block": block.start}
        events: list[Event] = [("content_block_start", start)]
        if block.pending:
            events.append(self._delta(block, "".join(block.pending)))
            block.pending = []
        return events

    def _end(self) -> list[Event]:
        block, self._open = self._open, None
        if block is None:
            return []
        return [("content_block_stop", {"type": "content_block_stop", "index": block.index})]

    @staticmethod
    def _delta(block: _Block, piece: str) -> Event:
        delta = {"type": "content_block_delta", "index": block.index, "delta": block.delta(piece)}
        return ("content_block_delta", delta)

    @staticmethod
    def _error(error_type: str, message: str) -> Event:
        return ("error", {"type": "error", "error": {"type": error_type, "message": message}})

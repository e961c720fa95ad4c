"""A response's output as the pipeline's chat chunks (after output safety) build it: its items
(the assistant's message, each function call), and the Responses events that stream them. Pure.

Items are numbered (`output_index`) in the order they first appear: the message with its first
text, a function call with its first arguments once the upstream named it (OpenAI's
`output_item.added` carries the call's name and call_id; a call without arguments appears when
the answer ends). An answer that is only tool calls has no message item, as OpenAI's have none;
an answer with nothing at all has an empty one. Every event names its item, so pieces of items
may interleave: output safety holds each text channel's last characters until it has checked
them (gateway/safety/output.py), so the message's or a call's tail can come after the next call
began, and a short text held to the end comes after calls whose arguments were long enough to
be released earlier. Items are therefore done together when the answer ends, each in output
order with its final text or arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from msgspec import UNSET

from gateway.responses.items import FunctionCall, InputItem, InputMessage
from protocol.chunk import CONTENT, Choice, Chunk, TokenLogprob, ToolCall, TopLogprob, tool_channel

# (event name, data without its type and sequence_number, which the run adds)
Event = tuple[str, dict[str, Any]]
ItemStatus = Literal["in_progress", "completed", "incomplete"]
Logprob = dict[str, Any]  # one token's, as an output_text part lists it


def output_text_part(text: str, logprobs: list[Logprob] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs or ())}


def _alternative(entry: TopLogprob | TokenLogprob) -> Logprob:
    encoded = entry.bytes if isinstance(entry.bytes, list) else list(entry.token.encode())
    return {"token": entry.token, "logprob": entry.logprob, "bytes": encoded}


def _logprobs(choice: Choice) -> list[Logprob]:
    """The content's logprobs a chat chunk carries (after output safety), in the Responses shape:
    each token with its bytes and its alternatives (`top_logprobs`)."""
    entries = choice.token_logprobs(CONTENT) or ()
    return [
        {**_alternative(entry), "top_logprobs": [_alternative(top) for top in entry.top_logprobs or ()]}
        for entry in entries
        if isinstance(entry, TokenLogprob)
    ]


@dataclass
class _Message:
    id: str
    index: int
    pieces: list[str] = field(default_factory=list)
    logprobs: list[Logprob] = field(default_factory=list)  # every token's so far
    unsent: list[Logprob] = field(default_factory=list)  # those of tokens with no text yet

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def item(self, status: ItemStatus) -> dict[str, Any]:
        text = self.text
        return {
            "type": "message",
            "id": self.id,
            "status": status,
            "role": "assistant",
            "content": [output_text_part(text, self.logprobs)] if text or status != "in_progress" else [],
        }


@dataclass
class _Call:
    """One tool call of the answer, by its text channel (`tool:N`); `index` once it is an item."""

    call_id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)  # its arguments, every piece so far
    written: int = 0  # pieces already sent in deltas
    id: str = ""
    index: int | None = None

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)

    def item(self, status: ItemStatus, *, arguments: str | None = None) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": self.id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments if arguments is None else arguments,
            "status": status,
        }


class ResponseOutput:
    def __init__(self, stem: str) -> None:
        self._stem = stem  # the response id's, for its items' ids
        self._message: _Message | None = None
        self._calls: dict[str, _Call] = {}  # by text channel, in the order they appeared
        self._order: list[_Message | _Call] = []  # the items, by output_index

    @property
    def text(self) -> str:
        return self._message.text if self._message is not None else ""

    def feed(self, chunk: Chunk) -> list[Event]:
        """The events for one chunk's text and tool-call pieces."""
        events: list[Event] = []
        for choice in chunk.choices:
            text = choice.content()
            logprobs = _logprobs(choice) if choice.logprobs is not None else []
            if text or logprobs:
                events += self._text(text, logprobs)
            body = choice.body
            for position, call in enumerate((body.tool_calls or ()) if body is not None else ()):
                events += self._call(call, position)
        return events

    def close(self, status: ItemStatus) -> list[Event]:
        """The answer ended (completed or incomplete): every item still unannounced is added,
        then each is done, in output order. Nothing said at all is an empty message."""
        events: list[Event] = []
        for call in self._calls.values():
            if call.index is None:
                events += self._add_call(call)
        if not self._order:
            events += self._add_message()
        for entry in self._order:
            events += self._done(entry, status)
        return events

    def items(self, status: ItemStatus) -> list[dict[str, Any]]:
        """The output items so far, for the response object."""
        return [entry.item(status) for entry in self._order]

    def replay(self) -> tuple[InputItem, ...]:
        """The output as input items: what a follow-up with `previous_response_id` reads."""
        replayed: list[InputItem] = []
        for entry in self._order:
            if isinstance(entry, _Message):
                replayed.append(InputMessage("assistant", entry.text))
            else:
                replayed.append(FunctionCall(entry.call_id, entry.name, entry.arguments, id=entry.id))
        return tuple(replayed)

    # -- items ----------------------------------------------------------------------------------

    def _text(self, text: str, logprobs: list[Logprob]) -> list[Event]:
        """A delta of the message's text with its tokens' logprobs. A token whose text is not out
        yet (the first bytes of a character) has its logprob sent with the next text."""
        events = self._add_message() if self._message is None else []
        message = self._message
        assert message is not None
        message.logprobs += logprobs
        message.unsent += logprobs
        if not text:
            return events
        message.pieces.append(text)
        sent, message.unsent = message.unsent, []
        where = {"item_id": message.id, "output_index": message.index, "content_index": 0}
        return [*events, ("response.output_text.delta", {**where, "delta": text, "logprobs": sent})]

    def _add_message(self) -> list[Event]:
        message = self._message = _Message("msg_" + self._stem, len(self._order))
        self._order.append(message)
        where = {"item_id": message.id, "output_index": message.index, "content_index": 0}
        return [
            (
                "response.output_item.added",
                {"output_index": message.index, "item": message.item("in_progress")},
            ),
            ("response.content_part.added", {**where, "part": output_text_part("")}),
        ]

    def _call(self, delta: ToolCall, position: int) -> list[Event]:
        key = tool_channel(delta, position)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = _Call()
        function = delta.function if delta.function is not UNSET else None
        if call.index is None:  # an upstream may name the call in a later piece than its first
            if isinstance(delta.id, str) and delta.id:
                call.call_id = delta.id
            if function is not None and isinstance(function.name, str) and function.name:
                call.name = function.name
        arguments = function.arguments if function is not None else None
        if isinstance(arguments, str) and arguments:
            call.pieces.append(arguments)
        if call.index is None:
            # With its first arguments: the message, if any, usually comes first (the text a
            # safety hold kept is released, with the calls' arguments, when the answer ends).
            return self._add_call(call) if call.name and call.pieces else []
        return self._unwritten(call)

    def _add_call(self, call: _Call) -> list[Event]:
        call.index = len(self._order)
        call.id = f"fc_{self._stem}_{call.index}"
        call.call_id = call.call_id or f"call_{self._stem}_{call.index}"  # an upstream that gave none
        self._order.append(call)
        added = call.item("in_progress", arguments="")
        return [
            ("response.output_item.added", {"output_index": call.index, "item": added}),
            *self._unwritten(call),
        ]

    def _unwritten(self, call: _Call) -> list[Event]:
        """The call's pieces not yet sent, as one delta."""
        assert call.index is not None
        piece = "".join(call.pieces[call.written :])
        call.written = len(call.pieces)
        if not piece:
            return []
        delta = {"item_id": call.id, "output_index": call.index, "delta": piece}
        return [("response.function_call_arguments.delta", delta)]

    def _done(self, entry: _Message | _Call, status: ItemStatus) -> list[Event]:
        done = ("response.output_item.done", {"output_index": entry.index, "item": entry.item(status)})
        if isinstance(entry, _Message):
            where = {"item_id": entry.id, "output_index": entry.index, "content_index": 0}
            text = entry.text
            return [
                ("response.output_text.done", {**where, "text": text, "logprobs": list(entry.logprobs)}),
                ("response.content_part.done", {**where, "part": output_text_part(text, entry.logprobs)}),
                done,
            ]
        where = {"item_id": entry.id, "output_index": entry.index}
        arguments = {**where, "name": entry.name, "arguments": entry.arguments}
        return [("response.function_call_arguments.done", arguments), done]

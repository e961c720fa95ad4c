"""Server-Sent Events: the one encoder (OpenAI `data:` frames, named events) and the one decoder.

The decoder works line by line, following the WHATWG event-stream rules. It is pure, so its corner cases are unit-tested: `data:` fields spread over several lines are joined
with newlines, comment lines (`: keep-alive`) are skipped, one space after the colon is
optional, unknown fields are ignored, and an event is dispatched at the blank line that ends it.
Providers differ in all of these (OpenAI sends bare `data:` frames, Anthropic adds `event:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def encode_data(payload: Any) -> bytes:
    """One `data:` frame holding `payload` as JSON (OpenAI's streaming framing)."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def encode_event(name: str, payload: Any) -> bytes:
    """One named event (`event: NAME`) holding `payload` as JSON (Anthropic's streaming framing)."""
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"


@dataclass(frozen=True)
class SSEEvent:
    data: str
    event: str | None = None  # the `event:` field; None means the default "message"
    id: str | None = None


class SSEDecoder:
    def __init__(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, line: str) -> SSEEvent | None:
        """One line without its line ending; returns the event it completes, if any."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value or None
        elif name == "id" and "\0" not in value:
            self._id = value
        return None

    def end(self) -> SSEEvent | None:
        """The body ended. A last event without its blank line is still delivered: servers that
        close right after their final frame exist, and dropping it would lose `[DONE]`."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        event = SSEEvent("\n".join(self._data), self._event, self._id) if self._data else None
        # The last event id persists across events (per the spec); type and data do not.
        self._data = []
        self._event = None
        return event


class LineTooLong(ValueError):
    """An event line past the reader's bound."""


class DataLines:
    """The `data:` payloads of a body whose every event is a single `data:` line, as bytes.

    Our nodes' streams are of that shape, and they are read for every chunk of every stream, so
    this skips what SSEDecoder does for any server (str lines, multi-line data, event objects):
    it splits bytes and hands back each payload, for msgspec to decode as it is. Lines of other
    fields, comments and blank separators are dropped.
    """

    def __init__(self, max_line_bytes: int = 16 * 1024 * 1024) -> None:
        self._pending = b""  # a line cut between two body pieces
        # An upstream that never ends its line would otherwise grow the reader without bound.
        self._max_line_bytes = max_line_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Raises LineTooLong when one line outgrows the bound."""
        lines = (self._pending + data if self._pending else data).split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > self._max_line_bytes:
            raise LineTooLong(f"an event line is longer than {self._max_line_bytes} bytes")
        return [line[5:].strip() for line in lines if line.startswith(b"data:")]

    def end(self) -> list[bytes]:
        """The body ended: a last line without its line break still counts."""
        rest, self._pending = self._pending, b""
        return [rest[5:].strip()] if rest.startswith(b"data:") else []

"""A Server-Sent Events decoder, line by line, following the WHATWG event-stream rules.

Pure, so its corner cases are unit-tested: `data:` fields spread over several lines are joined
with newlines, comment lines (`: keep-alive`) are skipped, one space after the colon is
optional, unknown fields are ignored, and an event is dispatched at the blank line that ends it.
Providers differ in all of these (OpenAI sends bare `data:` frames, Anthropic adds `event:`).
"""

from __future__ import annotations

from dataclasses import dataclass


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

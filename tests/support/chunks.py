"""Typed stream items (protocol/chunk.py) as the wire would show them, for assertions."""

from __future__ import annotations

from typing import Any

from protocol.chunk import Chunk, Completion, StreamFailed, to_builtins


def as_wire(item: Chunk | Completion | StreamFailed) -> dict[str, Any]:
    """A chunk or answer as its JSON; a StreamFailed as OpenAI's error event."""
    if isinstance(item, StreamFailed):
        return {"error": {"message": item.message, "type": item.kind, "param": None, "code": item.code}}
    return to_builtins(item)

"""`responses:` in the gateway config: how many Responses API runs the gateway keeps, and for how long."""

from __future__ import annotations

import msgspec


class ResponsesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    # Responses kept in memory (running and finished); when full, the oldest finished one goes.
    max_stored: int = 10_000
    # A finished response can be retrieved for this long; a gateway restart loses them all.
    ttl_s: float = 3600.0
    # Background runs at once; one more is refused with 429 (foreground ones are bounded by
    # their connections).
    max_background: int = 64

    def __post_init__(self) -> None:
        if self.max_stored < 1 or self.max_background < 1:
            raise ValueError("responses: max_stored and max_background must be at least 1")
        if self.ttl_s <= 0:
            raise ValueError("responses: ttl_s must be positive")

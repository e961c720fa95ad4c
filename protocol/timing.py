"""One request's latency breakdown, as nodes send it to the gateway and the gateway to its client.

Two carriers, one struct:

- the `Server-Timing` response header (the W3C web standard, durations in milliseconds):
  `gateway;dur=0.41, queue;dur=2.10, prefill;dur=35.02, decode;dur=410.77, total;dur=449.30`.
  Non-streamed answers carry every part; a stream's headers leave at its first byte, so they carry
  what is known then (gateway so far, queue, prefill).
- `timings`, an extension field on a stream's final usage chunk (`choices: []`), with the whole
  breakdown in milliseconds: `{"queue_ms": 2.1, "prefill_ms": 35.0, "decode_ms": 410.8, ...}`.

A node fills queue, prefill, decode and total (its own arrival to last token); the gateway adds
`gateway` (its own overhead: total minus the time it waited on upstreams) and its own total.
Parts that did not happen (no token was generated, an upstream that reports none) are left out.
"""

from __future__ import annotations

from typing import Any

import msgspec

TIMINGS_FIELD = "timings"  # the usage chunk's extension field
PARTS = ("gateway", "queue", "prefill", "decode", "total")


class Timing(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Durations in seconds; None where the part is unknown or did not happen."""

    gateway: float | None = None
    queue: float | None = None
    prefill: float | None = None
    decode: float | None = None
    total: float | None = None

    def server_timing(self) -> str:
        """The `Server-Timing` header value (empty when nothing is known)."""
        return ", ".join(
            f"{part};dur={value * 1000:.2f}" for part in PARTS if (value := getattr(self, part)) is not None
        )

    def to_wire(self) -> dict[str, float]:
        """The `timings` extension field: milliseconds, known parts only."""
        return {
            f"{part}_ms": round(value * 1000, 3)
            for part in PARTS
            if (value := getattr(self, part)) is not None
        }


def parse_server_timing(header: str | None) -> Timing:
    """The parts of a `Server-Timing` header that this contract names; anything else (other
    metrics, descriptions, malformed entries) is ignored, as the standard asks of readers."""
    values: dict[str, float] = {}
    for entry in (header or "").split(","):
        name, _, params = entry.strip().partition(";")
        if name not in PARTS:
            continue
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip() == "dur":
                try:
                    values[name] = float(value.strip().strip('"')) / 1000
                except ValueError:
                    pass
    return Timing(**values)


def timing_from_wire(field: Any) -> Timing:
    """The `timings` extension field back into a Timing; anything malformed reads as unknown."""
    if not isinstance(field, dict):
        return Timing()
    values: dict[str, float] = {}
    for part in PARTS:
        value = field.get(f"{part}_ms")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            values[part] = value / 1000
    return Timing(**values)

"""One client call as the request path tracks it: tenant, served target, response headers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from router.types import Target, TenantPolicy


def header_safe(value: str) -> str:
    """Route reasons become header values: ASCII, one line, bounded."""
    # Control characters (CR, LF, ...) in directory data would break the response's headers.
    if value.isascii() and value.isprintable():  # the usual case, without a pass per character
        return value[:512]
    printable = "".join(ch if " " <= ch <= "~" else " " for ch in value)
    return printable[:512]


@dataclass
class CallContext:
    """One client call: who it is for and the headers its response (or error) carries."""

    request_id: str
    client_region: str | None
    started: float = field(default_factory=time.monotonic)
    tenant: TenantPolicy | None = None
    model: str = "-"
    region: str = "-"
    headers: dict[str, str] = field(default_factory=dict)
    stream_error: str | None = None  # why a stream ended with an error event
    # Leads x-meridian-route for a `model: auto` request: `auto:small;classifier=0.34<1.00;`.
    route_prefix: str = ""

    def __post_init__(self) -> None:
        self.headers["x-request-id"] = self.request_id

    def served_by(self, target: Target, attempts: int, route: str | None = None) -> None:
        """`route` (default: the router's reason) is what x-meridian-route says about the target."""
        self.model, self.region = target.model, target.region
        route = self.route_prefix + (route or target.reason)
        route_reason = route if attempts <= 1 else f"{route}; after {attempts - 1} failed"
        self.headers.update(
            {
                "x-meridian-region": target.region,
                "x-meridian-model": target.model,
                "x-meridian-node": target.target_id,
                "x-meridian-route": header_safe(route_reason),
            }
        )

"""One client call as the request path tracks it: tenant, served target, response headers, latency."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.call.latency import Latency
from gateway.observe import QUIET, CallObserver
from gateway.safety.guard import CallSafety
from protocol.chunk import Usage
from router.types import Target, TenantPolicy

if TYPE_CHECKING:
    from gateway.escalation.cascade import Escalated


def header_safe(value: str) -> str:
    """Route reasons become header values: ASCII, one line, bounded."""
    # Control characters (CR, LF, ...) in directory data would break the response's headers.
    if value.isascii() and value.isprintable():  # the usual case, without a pass per character
        return value[:512]
    printable = "".join(ch if " " <= ch <= "~" else " " for ch in value)
    return printable[:512]


# A client's conversation id: the sticky key that keeps it on one model version in a rollout
# (router/rollout.py); without it, the request's `user` field, else its prefix affinity key.
SESSION_HEADER = "x-meridian-session"


@dataclass
class CallContext:
    """One client call: who it is for and the headers its response (or error) carries."""

    request_id: str
    client_region: str | None
    # x-meridian-session: keeps a conversation on one model version during a rollout.
    session_key: str = ""
    started: float = field(default_factory=time.monotonic)
    tenant: TenantPolicy | None = None
    model: str = "-"
    region: str = "-"
    headers: dict[str, str] = field(default_factory=dict)
    stream_error: str | None = None  # why a stream ended with an error event
    safety: CallSafety | None = None  # the content checks made on this call (gateway/safety)
    # The latency breakdown (gateway overhead, queue, TTFT, prefill, decode, total): one place.
    latency: Latency = field(default_factory=Latency)
    # Who observes the call (gateway/observe.py: tracing, metrics); told of every stage.
    observed: CallObserver = QUIET
    # For the usage event (gateway/call/usage.py):
    api_key_id: str = "-"  # a short hash of the caller's key
    target: Target | None = None  # the upstream that served the call (the first, for a stream)
    retries: int = 0  # targets that failed before `target` answered
    # What the small tier used of an `auto` request the confidence cascade escalated.
    escalation: Escalated | None = None
    # How it ended, for the observers: the usage the client was told, the finish reasons.
    usage: Usage | None = None
    finish_reasons: list[str] = field(default_factory=list)
    continuations: int = 0
    recorded: bool = False  # the observers were told it ended (once per call)

    def __post_init__(self) -> None:
        self.headers["x-request-id"] = self.request_id
        self.latency.started = self.started

    def served_by(self, target: Target, attempts: int, prefix: str, route: str | None = None) -> None:
        """`prefix` (the plan's notes) then `route` (default: the router's reason) is what
        x-meridian-route says about the target."""
        self.model, self.region = target.model, target.region
        self.target, self.retries = target, max(0, attempts - 1)
        route = prefix + (route or target.reason)
        route_reason = route if attempts <= 1 else f"{route}; after {attempts - 1} failed"
        self.headers.update(
            {
                "x-meridian-region": target.region,
                "x-meridian-model": target.model,
                "x-meridian-node": target.target_id,
                "x-meridian-route": header_safe(route_reason),
            }
        )

"""One client call as the request path tracks it: who it is for, what the edge needs to answer it."""

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


@dataclass(frozen=True, slots=True)
class Served:
    """The upstream that answered a call (for a stream, the one that opened it), how many
    targets the failover tried to get there, and for a stream the prompt as that upstream counted
    it when it opened (None where it did not say)."""

    target: Target
    attempts: int
    opened_usage: Usage | None = None

    @property
    def retries(self) -> int:
        """Targets that failed before `target` answered."""
        return max(0, self.attempts - 1)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call that reached an upstream ended, as the stage that ended it saw it: the usage
    the client was told, the finish reasons, the continuations, and why a stream ended with an
    error event. A call that failed before any answer has none of it (`Outcome()`)."""

    usage: Usage | None = None
    finish_reasons: tuple[str, ...] = ()
    continuations: int = 0
    stream_error: str | None = None


NO_OUTCOME = Outcome()


_NO_KEY = "-"


@dataclass(slots=True)
class CallContext:
    """One client call: what the edge needs to answer it, however far it got.

    A stage's results are values it returns (the plan, the admission ticket, the quota's
    admission, the route's targets, the answer or the stream, the `Outcome`). What stays here is
    what an error answer and the call's record need when a stage raises part-way, in three kinds:

    - fixed when the call starts: `request_id`, `client_region`, `session_key`, `started`,
      `observed`, and `latency` (the breakdown, which the stages' timers add to);
    - set once, by the stage that learns it: `tenant` and `api_key_id` (authentication),
      `safety` (the content checks), `served` (the failover's answer), `escalation` (the
      cascade, whose small-tier tokens are charged however the call then ends), `recorded`
      (the observers were told it ended);
    - `headers`: the answer's headers, added to as they are learned (the request id, the quota's,
      the model, the route), so that an error answer carries what a success would have.
    """

    request_id: str
    client_region: str | None
    # x-meridian-session: keeps a conversation on one model version during a rollout.
    session_key: str = ""
    started: float = field(default_factory=time.monotonic)
    # Who observes the call (gateway/observe.py: tracing, metrics); told of every stage.
    observed: CallObserver = QUIET
    # The latency breakdown (gateway overhead, queue, TTFT, prefill, decode, total): one place.
    latency: Latency = field(default_factory=Latency)
    headers: dict[str, str] = field(default_factory=dict)
    tenant: TenantPolicy | None = None
    api_key_id: str = _NO_KEY  # a short hash of the caller's key, for the usage event
    safety: CallSafety | None = None  # the content checks made on this call (gateway/safety)
    served: Served | None = None
    # What the small tier used of an `auto` request the confidence cascade escalated.
    escalation: Escalated | None = None
    recorded: bool = False

    def __post_init__(self) -> None:
        self.headers["x-request-id"] = self.request_id
        self.latency.started = self.started

    def __setattr__(self, name: str, value: object) -> None:
        # The set-once fields are set by the one stage that learns them; a second write would be
        # two stages disagreeing about the call, and is refused (the dataclass's __init__, which
        # fills the empty slots, is the first write).
        if name in _SET_ONCE:
            try:
                current = getattr(self, name)
            except AttributeError:  # in __init__
                current = _SET_ONCE[name]
            if current is not _SET_ONCE[name]:
                raise AttributeError(f"CallContext.{name} is set once, and was already set")
        object.__setattr__(self, name, value)

    @property
    def model(self) -> str:
        """The model serving the call as far as it got: the served target's, else the planned one."""
        if self.served is not None:
            return self.served.target.model
        return self.headers.get("x-meridian-model", "-")

    def plans(self, model: str) -> None:
        """The model the call is planned for (planned, degraded or escalated): the answer says it."""
        self.headers["x-meridian-model"] = model

    def served_by(
        self,
        target: Target,
        attempts: int,
        prefix: str,
        route: str | None = None,
        *,
        opened_usage: Usage | None = None,
    ) -> None:
        """`prefix` (the plan's notes) then `route` (default: the router's reason) is what
        x-meridian-route says about the target."""
        self.served = Served(target, attempts, opened_usage)
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


# CallContext's set-once fields and the value each has until its stage sets it.
_SET_ONCE: dict[str, object] = {
    "tenant": None,
    "api_key_id": _NO_KEY,
    "safety": None,
    "served": None,
    "escalation": None,
    "recorded": False,
}

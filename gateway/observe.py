"""How the request path is observed: it reports each stage to an observer, which is handed down.

The pipeline never knows who watches. It asks the call's `CallObserver` (made by the gateway's
`Observer` when the call starts) for a `Stage` around each step it takes, passes the stage down as
a parameter to whatever runs inside it (an escalation's route and attempts, a continuation's),
and tells the call observer the facts of the call as they become known. Tracing
(gateway/tracing.py) and metrics (gateway/metrics.py) are observers; with neither, the no-op
observer below costs a method call per stage.

No context variable carries the current span, and nothing subclasses the pipeline: a stage's
parent is the stage object it was opened from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.chunk import Chunk, Usage
from router.types import Target


class Stage(Protocol):
    """One step of the call (admission, route, an attempt, a continuation...)."""

    def note(self, **attributes: Any) -> None:
        """Facts about the step (the route's targets, an attempt's outcome)."""

    def stage(self, name: str, **attributes: Any) -> Any:
        """A context manager giving a step inside this one."""

    def attempt(self, target: Target, headers: dict[str, str]) -> Any:
        """A context manager around one upstream attempt; may add propagation headers
        (`traceparent`) to `headers`, which the attempt sends."""


@dataclass(frozen=True)
class Ended:
    """How a call ended, for the observers that account for it."""

    status: str  # "200", an HTTP status, or "stream_error"
    stream: bool
    tenant: str  # "-" before authentication
    model: str
    region: str
    route: str | None  # x-meridian-route, when the call was routed
    stream_error: str | None
    total_s: float
    gateway_s: float
    usage: Usage | None
    finish_reasons: Sequence[str]
    attempts: int
    continuations: int
    decisions: Sequence[Any]  # the safety layer's Decisions


class CallObserver(Stage, Protocol):
    """One call, as its observers see it (also the stage every top-level step opens under)."""

    wants_text: bool  # does it want the client's answer text (`answered_text`)?

    def authenticated(
        self, tenant: Any, started_ns: int, ended_ns: int, error: BaseException | None
    ) -> None: ...

    def planned(self, operation: str, request: Any, prompt: Any, degraded: bool) -> None: ...

    def first_chunk(self, model: str, seconds: float) -> None: ...

    def answered_text(self, text: str) -> None: ...

    def ended(self, ended: Ended) -> None: ...

    # Facts the call's stages decided, which metrics count (a tracer may note them):
    def auto_routed(self, tenant: str, tier: str, rule: str) -> None:
        """An `auto` request was planned for `tier` by `rule`."""

    def escalation_judged(self, tenant: str, family: str, rate: float) -> None:
        """The cascade judged the small model's first tokens; `rate`: the tenant's escalation
        rate for the family since (gateway/escalation)."""

    def escalated(
        self, tenant: str, family: str, outcome: str, wasted: tuple[int, int] | None = None
    ) -> None:
        """An escalation's outcome (low_confidence: served by the large tier, `wasted` the small
        tier's (prompt, completion) tokens; large_unavailable: the small answer stands)."""

    def quota_admitted(self, tenant: str, source: str) -> None:
        """The quota admitted the request, from `source` (the shared store, or local fallback)."""

    def continued(self) -> None:
        """A broken stream continued on another upstream."""

    def priced(self, tenant: str, model: str, cost_usd: float) -> None:
        """The call's usage on `model` cost this (its usage event's price)."""


class Observer(Protocol):
    """The gateway's observer: one CallObserver per call."""

    def start(self, headers: Mapping[str, str], request_id: str) -> CallObserver: ...


class QuietFacts:
    """The counted facts (CallObserver), observed by nothing: the base of observers that count
    none or only some of them."""

    def auto_routed(self, tenant: str, tier: str, rule: str) -> None:
        return None

    def escalation_judged(self, tenant: str, family: str, rate: float) -> None:
        return None

    def escalated(
        self, tenant: str, family: str, outcome: str, wasted: tuple[int, int] | None = None
    ) -> None:
        return None

    def quota_admitted(self, tenant: str, source: str) -> None:
        return None

    def continued(self) -> None:
        return None

    def priced(self, tenant: str, model: str, cost_usd: float) -> None:
        return None


class QuietCall(QuietFacts):
    """A call (and stage) that observes nothing: the base of observers that watch only a few
    of the call's facts (metrics)."""

    wants_text = False

    def note(self, **attributes: Any) -> None:
        return None

    @contextmanager
    def stage(self, name: str, **attributes: Any) -> Iterator[QuietCall]:
        yield self

    @contextmanager
    def attempt(self, target: Target, headers: dict[str, str]) -> Iterator[QuietCall]:
        yield self

    def authenticated(self, tenant: Any, started_ns: int, ended_ns: int, error: BaseException | None) -> None:
        return None

    def planned(self, operation: str, request: Any, prompt: Any, degraded: bool) -> None:
        return None

    def first_chunk(self, model: str, seconds: float) -> None:
        return None

    def answered_text(self, text: str) -> None:
        return None

    def ended(self, ended: Ended) -> None:
        return None


QUIET = QuietCall()


class NoObserver:
    def start(self, headers: Mapping[str, str], request_id: str) -> CallObserver:
        return QUIET


class Observers:
    """Several observers as one (metrics and tracing)."""

    def __init__(self, *observers: Observer) -> None:
        self._observers = observers

    def start(self, headers: Mapping[str, str], request_id: str) -> CallObserver:
        calls = [observer.start(headers, request_id) for observer in self._observers]
        calls = [call for call in calls if call is not QUIET]
        if not calls:
            return QUIET
        return calls[0] if len(calls) == 1 else _Both(calls)


class _Both:
    """The calls of several observers as one; a stage opens in each."""

    def __init__(self, calls: Sequence[Any]) -> None:
        self._calls = calls

    @property
    def wants_text(self) -> bool:  # asked each time: a tracer knows only once the call is planned
        return any(getattr(call, "wants_text", False) for call in self._calls)

    def note(self, **attributes: Any) -> None:
        for call in self._calls:
            call.note(**attributes)

    @contextmanager
    def stage(self, name: str, **attributes: Any) -> Iterator[_Both]:
        with _entered([call.stage(name, **attributes) for call in self._calls]) as stages:
            yield _Both(stages)

    @contextmanager
    def attempt(self, target: Target, headers: dict[str, str]) -> Iterator[_Both]:
        with _entered([call.attempt(target, headers) for call in self._calls]) as stages:
            yield _Both(stages)

    def authenticated(self, tenant: Any, started_ns: int, ended_ns: int, error: BaseException | None) -> None:
        for call in self._calls:
            call.authenticated(tenant, started_ns, ended_ns, error)

    def planned(self, operation: str, request: Any, prompt: Any, degraded: bool) -> None:
        for call in self._calls:
            call.planned(operation, request, prompt, degraded)

    def first_chunk(self, model: str, seconds: float) -> None:
        for call in self._calls:
            call.first_chunk(model, seconds)

    def answered_text(self, text: str) -> None:
        for call in self._calls:
            if getattr(call, "wants_text", False):
                call.answered_text(text)

    def ended(self, ended: Ended) -> None:
        for call in self._calls:
            call.ended(ended)

    def auto_routed(self, tenant: str, tier: str, rule: str) -> None:
        for call in self._calls:
            call.auto_routed(tenant, tier, rule)

    def escalation_judged(self, tenant: str, family: str, rate: float) -> None:
        for call in self._calls:
            call.escalation_judged(tenant, family, rate)

    def escalated(
        self, tenant: str, family: str, outcome: str, wasted: tuple[int, int] | None = None
    ) -> None:
        for call in self._calls:
            call.escalated(tenant, family, outcome, wasted)

    def quota_admitted(self, tenant: str, source: str) -> None:
        for call in self._calls:
            call.quota_admitted(tenant, source)

    def continued(self) -> None:
        for call in self._calls:
            call.continued()

    def priced(self, tenant: str, model: str, cost_usd: float) -> None:
        for call in self._calls:
            call.priced(tenant, model, cost_usd)


@contextmanager
def _entered(managers: list[Any]) -> Iterator[list[Any]]:
    with ExitStack() as stack:
        yield [stack.enter_context(manager) for manager in managers]


def chunk_text(chunk: Chunk) -> str:
    return "".join(choice.content() for choice in chunk.choices)

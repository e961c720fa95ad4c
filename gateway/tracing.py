"""Traces of the gateway's request path (OpenTelemetry): an observer (gateway/observe.py).

When `telemetry.start_tracing` returns a Tracing, the app gives the pipeline a TracingObserver;
when tracing is off none of this exists, so the request path creates no span. One trace per call:

    chat {model}              SERVER: the whole call; a client's W3C traceparent is its parent
    ├── authenticate
    ├── admission             the gateway's load admission (it may queue, or degrade the model)
    ├── quota.admit
    ├── route                 meridian.route.targets
    ├── escalation            `auto` on the small tier: its first K tokens judged (meridian.escalated,
    │                         meridian.escalation.verdict); an escalation's route and attempts inside
    ├── attempt {target}      CLIENT, one per target tried: meridian.target, meridian.region,
    │   └── chat {model}        meridian.outcome; its traceparent goes to the node, whose span
    │       ├── queue           (regional_node/server/tracing.py) holds the engine's timings
    │       ├── prefill
    │       └── decode
    ├── continuation          a broken stream continued elsewhere (its route and attempts inside)
    └── quota.settle

A call the sampler leaves out gets no child spans either (as a parent-based sampler would
decide), only the traceparent that tells the node it was sampled out. The server span carries the
GenAI semantic-convention attributes (operation, request and response model, token usage, finish
reasons) and Meridian's own (tenant, region, route reason, attempts, continuations, degraded).
Prompt and completion text are recorded only for tenants whose policy sets `trace_content`, and
then with secrets and personal data redacted (gateway/safety/rules.py `redact_secrets`); headers,
keys and credentials never are.

Each stage's span is the child of the stage object it was opened from: the pipeline passes stages
down as parameters. No context variable, no subclass of the pipeline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from gateway.observe import Ended, QuietFacts
from gateway.safety.guard import Decision
from gateway.safety.rules import redact_secrets
from gateway.upstreams.base import UpstreamError
from protocol.chunk import Usage
from router.types import Target
from telemetry import extract_context, inject_context


class TracingObserver:
    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def start(self, headers: Mapping[str, str], request_id: str) -> CallTrace:
        return CallTrace(self._tracer, extract_context(headers), time.time_ns(), request_id)


class _SpanStage:
    """A stage in a span; its inner stages are its children."""

    def __init__(self, tracer: Tracer, span: Span, call: CallTrace) -> None:
        self._tracer = tracer
        self.span = span
        self._call = call

    def note(self, **attributes: Any) -> None:
        if self.span.is_recording():
            self.span.set_attributes({_ATTRIBUTES.get(k, f"meridian.{k}"): v for k, v in attributes.items()})

    @contextmanager
    def stage(self, name: str, **attributes: Any) -> Iterator[_SpanStage]:
        parent = self._parent()
        if not parent.is_recording():
            yield _SpanStage(self._tracer, INVALID_SPAN, self._call)
            return
        span = self._tracer.start_span(name, context=set_span_in_context(parent))
        stage = _SpanStage(self._tracer, span, self._call)
        stage.note(**attributes)
        with span:
            yield stage

    @contextmanager
    def attempt(self, target: Target, headers: dict[str, str]) -> Iterator[_SpanStage]:
        """Each attempt in its own CLIENT span, whose context goes to the node as `traceparent`."""
        self._call.attempts += 1
        parent = self._parent()
        if not parent.is_recording():
            # Sampled out: no span, but the node still learns the trace and its sampling decision.
            inject_context(parent, headers)
            yield _SpanStage(self._tracer, INVALID_SPAN, self._call)
            return
        span = self._tracer.start_span(
            f"attempt {target.target_id}",
            context=set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            attributes={
                "meridian.target": target.target_id,
                "meridian.region": target.region,
                "meridian.target.kind": target.kind,
                "gen_ai.request.model": target.model,
            },
        )
        inject_context(span, headers)
        try:
            yield _SpanStage(self._tracer, span, self._call)
        except UpstreamError as error:
            span.set_attribute("meridian.outcome", "retryable" if error.retryable else "rejected")
            span.set_attribute("http.response.status_code", error.status_code)
            span.set_status(Status(StatusCode.ERROR, error.message))
            raise
        except BaseException as error:
            span.set_attribute(
                "meridian.outcome", "cancelled" if not isinstance(error, Exception) else "error"
            )
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise
        else:
            span.set_attribute("meridian.outcome", "ok")
        finally:
            span.end()

    def _parent(self) -> Span:
        return self.span


# Stage notes whose attribute names are not meridian.<name>.
_ATTRIBUTES = {
    "targets": "meridian.route.targets",
    "reason": "meridian.route.reason",
    "verdict": "meridian.escalation.verdict",
    "carried_tokens": "meridian.continuation.carried_tokens",
    "excluded": "meridian.continuation.excluded",
}


class CallTrace(QuietFacts, _SpanStage):
    """One call: its server span starts (back-dated to the call's arrival) when the call turns out
    to be a completion, at planning, or when its end is recorded (an early error). Calls that are
    not (/v1/models, /v1/usage) authenticate too, but leave no span behind."""

    def __init__(self, tracer: Tracer, parent: Any, start_ns: int, request_id: str) -> None:
        super().__init__(tracer, INVALID_SPAN, self)
        self._parent_context = parent
        self._start_ns = start_ns
        self._request_id = request_id
        self._root: Span | None = None
        self._authenticated: tuple[int, int, BaseException | None] | None = None
        self.attempts = 0
        self.operation = "chat"
        self.wants_text = False
        self._text: list[str] = []
        self._ended = False

    def _parent(self) -> Span:
        return self.root

    @property
    def root(self) -> Span:
        if self._root is None:
            self._root = self.span = self._tracer.start_span(
                "chat",
                context=self._parent_context,
                kind=SpanKind.SERVER,
                start_time=self._start_ns,
                attributes={"meridian.request_id": self._request_id, "meridian.degraded": False},
            )
            if self._authenticated is not None and self._root.is_recording():
                # It ran before anyone knew the call would be traced.
                started, ended, error = self._authenticated
                span = self._tracer.start_span(
                    "authenticate", context=set_span_in_context(self._root), start_time=started
                )
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                span.end(end_time=ended)
        return self._root

    def note(self, **attributes: Any) -> None:
        self.span = self.root
        super().note(**attributes)

    def authenticated(self, tenant: Any, started_ns: int, ended_ns: int, error: BaseException | None) -> None:
        self._authenticated = (started_ns, ended_ns, error)
        self.record_content = bool(tenant is not None and tenant.trace_content)

    record_content = False

    def planned(self, operation: str, request: Any, prompt: Any, degraded: bool) -> None:
        root = self.root
        if not root.is_recording():
            return
        self.operation = operation
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": request.model,
        }
        for name in ("max_tokens", "temperature", "top_p"):
            value = getattr(request, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                attributes[f"gen_ai.request.{name}"] = value
        if self.record_content:
            # Client text on a span: secrets and personal data redacted, as the safety docs promise.
            attributes["gen_ai.input.messages"] = redact_secrets(json.dumps(prompt, ensure_ascii=False))
            self.wants_text = True
        root.set_attributes(attributes)

    def first_chunk(self, model: str, seconds: float) -> None:
        return None

    def answered_text(self, text: str) -> None:
        if text:
            self._text.append(text)

    def ended(self, ended: Ended) -> None:
        if self._ended:
            return
        self._ended = True
        root = self.root
        if not root.is_recording():
            root.end()
            return
        if ended.model != "-":  # known once planned; a call refused before keeps the bare name
            root.update_name(f"{self.operation} {ended.model}")
        attributes: dict[str, Any] = {
            "gen_ai.response.model": ended.model,
            "meridian.region": ended.region,
            "meridian.attempts": self.attempts,
            "meridian.continuations": ended.continuations,
            "meridian.stream": ended.stream,
            "meridian.status": ended.status,
        }
        if ended.tenant != "-":
            attributes["meridian.tenant"] = ended.tenant
        if ended.route is not None:
            attributes["meridian.route.reason"] = ended.route
        root.set_attributes(attributes)
        _usage(root, ended.usage, list(ended.finish_reasons))
        if self.wants_text and (self._text or ended.status == "200"):
            output = [{"role": "assistant", "content": redact_secrets("".join(self._text))}]
            root.set_attribute("gen_ai.output.messages", json.dumps(output, ensure_ascii=False))
        if ended.status.isdigit():
            root.set_attribute("http.response.status_code", int(ended.status))
        if ended.status != "200":
            root.set_status(Status(StatusCode.ERROR, ended.stream_error or ended.status))
            root.set_attribute("error.type", ended.status)
        self._safety_spans(root, ended.decisions)
        root.end()

    def _safety_spans(self, root: Span, decisions: Sequence[Decision]) -> None:
        """Each content check (gateway/safety) as a span at the time it ran: rule and category
        names, actions and scores only, never the text checked."""
        context = set_span_in_context(root)
        for decision in decisions:
            ended = decision.decided_ns or time.time_ns()
            attributes: dict[str, Any] = {
                "meridian.safety.where": decision.where,
                "meridian.safety.layer": decision.layer,
                "meridian.safety.rule": decision.name,
                "meridian.safety.action": decision.action,
            }
            if decision.score is not None:
                attributes["meridian.safety.score"] = decision.score
            span = self._tracer.start_span(
                f"safety {decision.where}",
                context=context,
                start_time=ended - int(decision.latency_s * 1e9),
                attributes=attributes,
            )
            if decision.action in ("block", "error"):
                span.set_status(Status(StatusCode.ERROR, decision.action))
            span.end(end_time=ended)


def _usage(root: Span, usage: Usage | None, finish_reasons: list[str]) -> None:
    attributes: dict[str, Any] = {}
    if usage is not None:
        attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
        if isinstance(usage.prompt_tokens_details, dict):
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
    if finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = finish_reasons
    root.set_attributes(attributes)

"""Traces of the gateway's request path (OpenTelemetry), built only when tracing is on.

When `telemetry.start_tracing` returns a Tracing, build_gateway builds a TracedPipeline and a
TracedForwarder instead of the plain ones: the same request path with each stage wrapped in a
span. When tracing is off none of this exists, so the request path creates no span and checks
nothing per request. One trace per call:

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
GenAI semantic-convention attributes (operation, request and response
model, token usage, finish reasons) and Meridian's own (tenant, region, route reason, attempts,
continuations, degraded). Prompt and completion text are recorded only for tenants whose policy
sets `trace_content`; headers, keys and credentials never are.

Stages find their parent through one context variable, set while a call's coroutine runs
(complete, stream's opening, a continuation); code that runs later (a stream's settlement, from
the response's close) falls back to the call's server span, which CallContext.trace holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from gateway.admission import Ticket
from gateway.quota.interface import Admission
from gateway.request.context import CallContext
from gateway.request.pipeline import ParsedRequest, RequestPipeline
from gateway.request.plan import RequestPlan
from gateway.safety.guard import Decision
from gateway.streaming.continuation import Continue
from gateway.streaming.relay import StreamRelay
from gateway.streaming.served import ServedStream
from gateway.upstreams.base import Endpoint, UpstreamError
from gateway.upstreams.failover import Attempt, Forwarder, OpenedStream
from router.types import Target, TenantPolicy
from telemetry import extract_context, inject_context

T = TypeVar("T")
_OPERATIONS: dict[str, str] = {"chat": "chat", "completions": "text_completion"}


@dataclass
class CallTrace:
    """One call's server span and what its attributes need that the request path does not keep.

    The server span starts (back-dated to the call's arrival) when the call turns out to be a
    completion: at planning, or when its answer is recorded (an early error). Calls that are not
    (/v1/models, /v1/usage) authenticate too, but leave no span behind.
    """

    parent: Context | None  # the client's trace context, from its traceparent
    start_ns: int
    request_id: str
    root: Span | None = None
    authenticated: tuple[int, int, BaseException | None] | None = None  # start, end, error
    operation: str = "chat"
    attempts: int = 0
    continuations: int = 0
    record_content: bool = False
    completion: list[str] | None = None  # a stream's text, collected only when record_content
    ended: bool = False


# The call being traced on this task, and the span its next stage belongs under.
_current: ContextVar[tuple[CallTrace, Span] | None] = ContextVar("meridian_call_trace", default=None)


class TracedPipeline(RequestPipeline):
    def __init__(self, *, tracer: Tracer, **parts: Any) -> None:
        super().__init__(**parts)
        self._tracer = tracer

    # -- the call's server span -------------------------------------------------------------------

    def start_call(self, headers: Mapping[str, str]) -> CallContext:
        ctx = super().start_call(headers)
        ctx.trace = CallTrace(
            parent=extract_context(headers), start_ns=time.time_ns(), request_id=ctx.request_id
        )
        return ctx

    def _root(self, call: CallTrace) -> Span:
        if call.root is None:
            call.root = self._tracer.start_span(
                "chat",
                context=call.parent,
                kind=SpanKind.SERVER,
                start_time=call.start_ns,
                attributes={"meridian.request_id": call.request_id, "meridian.degraded": False},
            )
            if call.authenticated is not None and call.root.is_recording():
                # It ran before anyone knew the call would be traced.
                started, ended, error = call.authenticated
                span = self._tracer.start_span(
                    "authenticate", context=set_span_in_context(call.root), start_time=started
                )
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                span.end(end_time=ended)
        return call.root

    def _span(self, name: str, ctx: CallContext | None = None) -> Span:
        """A stage's span, under the span the running call's stages belong to."""
        current = _current.get()
        if current is not None:
            parent = current[1]
        elif ctx is not None and isinstance(ctx.trace, CallTrace):
            parent = self._root(ctx.trace)
        else:
            return INVALID_SPAN
        if not parent.is_recording():
            return INVALID_SPAN  # a call the sampler left out: its stages would be left out too
        return self._tracer.start_span(name, context=set_span_in_context(parent))

    def record(self, ctx: CallContext, status: str, *, stream: bool) -> None:
        super().record(ctx, status, stream=stream)
        call = ctx.trace
        if not isinstance(call, CallTrace) or call.ended:
            return
        call.ended = True
        root = self._root(call)
        if not root.is_recording():
            root.end()
            return
        if ctx.model != "-":  # known once planned; a call refused before keeps the bare name
            root.update_name(f"{call.operation} {ctx.model}")
        attributes: dict[str, Any] = {
            "gen_ai.response.model": ctx.model,
            "meridian.region": ctx.region,
            "meridian.attempts": call.attempts,
            "meridian.continuations": call.continuations,
            "meridian.stream": stream,
            "meridian.status": status,
        }
        if ctx.tenant is not None:
            attributes["meridian.tenant"] = ctx.tenant.tenant_id
        if "x-meridian-route" in ctx.headers:
            attributes["meridian.route.reason"] = ctx.headers["x-meridian-route"]
        root.set_attributes(attributes)
        if status.isdigit():
            root.set_attribute("http.response.status_code", int(status))
        if status != "200":
            root.set_status(Status(StatusCode.ERROR, ctx.stream_error or status))
            root.set_attribute("error.type", status)
        if ctx.safety is not None:
            self._safety_spans(root, ctx.safety.decisions)
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

    # -- stages -------------------------------------------------------------------------------------

    def authenticate(self, ctx: CallContext, authorization: str | None) -> TenantPolicy:
        call = ctx.trace
        if not isinstance(call, CallTrace):
            return super().authenticate(ctx, authorization)
        started = time.time_ns()
        try:
            tenant = super().authenticate(ctx, authorization)
        except Exception as error:
            call.authenticated = (started, time.time_ns(), error)
            raise
        call.authenticated = (started, time.time_ns(), None)
        call.record_content = tenant.trace_content
        return tenant

    def _plan(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> RequestPlan:
        plan = super()._plan(ctx, endpoint, request, body)
        call = ctx.trace
        if isinstance(call, CallTrace) and (root := self._root(call)).is_recording():
            call.operation = _OPERATIONS.get(endpoint, endpoint)
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": call.operation,
                "gen_ai.request.model": request.model,
            }
            for name in ("max_tokens", "temperature", "top_p"):
                value = getattr(request, name, None)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    attributes[f"gen_ai.request.{name}"] = value
            if call.record_content:
                prompt = body.get("messages") if endpoint == "chat" else body.get("prompt")
                attributes["gen_ai.input.messages"] = json.dumps(prompt, ensure_ascii=False)
            root.set_attributes(attributes)
        return plan

    async def _admit_load(self, ctx: CallContext, plan: RequestPlan) -> tuple[RequestPlan, Ticket]:
        with self._span("admission", ctx):
            plan, ticket = await super()._admit_load(ctx, plan)
        if plan.degraded_from is not None and isinstance(ctx.trace, CallTrace):
            self._root(ctx.trace).set_attribute("meridian.degraded", True)
        return plan, ticket

    async def _admit_quota(self, ctx: CallContext, plan: RequestPlan, ticket: Ticket) -> Admission:
        with self._span("quota.admit", ctx):
            return await super()._admit_quota(ctx, plan, ticket)

    def _route(
        self,
        ctx: CallContext,
        plan: RequestPlan,
        exclude: frozenset[str] = frozenset(),
        *,
        version: str | None = None,
    ) -> tuple[Target, ...]:
        with self._span("route", ctx) as span:
            targets = super()._route(ctx, plan, exclude, version=version)
            span.set_attribute("meridian.route.targets", [t.target_id for t in targets])
            if targets:
                span.set_attribute("meridian.route.reason", targets[0].reason)
            return targets

    async def _cascade(
        self, ctx: CallContext, plan: RequestPlan, opened: OpenedStream
    ) -> tuple[RequestPlan, OpenedStream]:
        call = ctx.trace
        with self._span("escalation", ctx) as span:
            token = (
                _current.set((call, span)) if isinstance(call, CallTrace) and span.is_recording() else None
            )
            try:
                plan, opened = await super()._cascade(ctx, plan, opened)
            finally:
                if token is not None:
                    _current.reset(token)
            span.set_attribute("meridian.escalated", ctx.escalation is not None)
            span.set_attribute("meridian.escalation.verdict", ctx.route_prefix)
        return plan, opened

    async def _settle(self, admission: Admission, served_tokens: int, event: bytes | None) -> None:
        with self._span("quota.settle"):
            await super()._settle(admission, served_tokens, event)

    async def _settle_stream(
        self, ctx: CallContext, plan: RequestPlan, admission: Admission, relay: StreamRelay | None
    ) -> None:
        call = ctx.trace
        if isinstance(call, CallTrace) and relay is not None:
            call.continuations = relay.continuations
            finish_reasons = [relay.finish_reason] if relay.finish_reason else []
            _usage(self._root(call), relay.usage or {}, finish_reasons)
            if call.completion is not None:
                output = [{"role": "assistant", "content": "".join(call.completion)}]
                self._root(call).set_attribute(
                    "gen_ai.output.messages", json.dumps(output, ensure_ascii=False)
                )
        with self._span("quota.settle", ctx):
            await super()._settle_stream(ctx, plan, admission, relay)

    # -- the two request shapes, and continuations: the stages' parent is set while they run -------

    async def complete(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> dict[str, Any]:
        call = ctx.trace
        if not isinstance(call, CallTrace):
            return await super().complete(ctx, endpoint, request, body)
        root = self._root(call)
        token = _current.set((call, root))
        try:
            result = await super().complete(ctx, endpoint, request, body)
        finally:
            _current.reset(token)
        choices = result.get("choices") or []
        _usage(
            root,
            result.get("usage") or {},
            [c["finish_reason"] for c in choices if c.get("finish_reason")],
        )
        if call.record_content:
            output = [c.get("message") or {"content": c.get("text")} for c in choices]
            root.set_attribute("gen_ai.output.messages", json.dumps(output, ensure_ascii=False))
        return result

    async def stream(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> ServedStream:
        call = ctx.trace
        if not isinstance(call, CallTrace):
            return await super().stream(ctx, endpoint, request, body)
        root = self._root(call)
        token = _current.set((call, root))
        try:
            served = await super().stream(ctx, endpoint, request, body)
        finally:
            _current.reset(token)
        if call.record_content and root.is_recording():
            call.completion = []
            served.chunks = _collecting(served.chunks, call.completion)
        return served

    async def _continue(
        self, ctx: CallContext, plan: RequestPlan, step: Continue, *, exclude: frozenset[str], version: str
    ) -> OpenedStream:
        call = ctx.trace
        if not isinstance(call, CallTrace):
            return await super()._continue(ctx, plan, step, exclude=exclude, version=version)
        attributes = {
            "meridian.continuation.carried_tokens": step.carried,
            "meridian.continuation.excluded": sorted(exclude),
        }
        root = self._root(call)
        span = INVALID_SPAN
        if root.is_recording():
            span = self._tracer.start_span(
                "continuation", context=set_span_in_context(root), attributes=attributes
            )
        with span:
            token = _current.set((call, span if span.is_recording() else root))
            try:
                return await super()._continue(ctx, plan, step, exclude=exclude, version=version)
            finally:
                _current.reset(token)


class TracedForwarder(Forwarder):
    """Each attempt in its own span, whose context goes to the node as `traceparent`."""

    def __init__(self, *args: Any, tracer: Tracer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tracer = tracer

    async def _attempt(self, target: Target, attempt: Attempt[T], headers: dict[str, str]) -> T:
        current = _current.get()
        if current is None:
            return await super()._attempt(target, attempt, headers)
        call, parent = current
        call.attempts += 1
        outgoing = dict(headers)
        if not parent.is_recording():
            # Sampled out: no span, but the node still learns the trace and its sampling decision.
            inject_context(parent, outgoing)
            return await super()._attempt(target, attempt, outgoing)
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
        inject_context(span, outgoing)
        try:
            result = await super()._attempt(target, attempt, outgoing)
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
            return result
        finally:
            span.end()


async def _collecting(
    chunks: AsyncGenerator[dict[str, Any], None], into: list[str]
) -> AsyncGenerator[dict[str, Any], None]:
    """The client's chunks as they are, their text appended to `into` on the way."""
    try:
        async for chunk in chunks:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if text:
                    into.append(text)
            yield chunk
    finally:
        await chunks.aclose()


def _usage(root: Span, usage: Mapping[str, Any], finish_reasons: list[str]) -> None:
    attributes: dict[str, Any] = {}
    for ours, theirs in (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens")):
        value = usage.get(ours)
        if isinstance(value, int):
            attributes[f"gen_ai.usage.{theirs}"] = value
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if isinstance(cached, int):
        attributes["gen_ai.usage.cache_read.input_tokens"] = cached
    if finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = finish_reasons
    root.set_attributes(attributes)

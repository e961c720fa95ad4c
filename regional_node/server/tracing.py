"""The node's span for one request (OpenTelemetry), when tracing is on (telemetry/).

The span continues the caller's trace (the gateway's attempt span, from W3C `traceparent`), so
one trace shows both processes. It is named like the gateway's (`chat {model}`, SERVER) and holds
three children timed from the engine's own split of the request: `queue` (arrival to first
scheduling), `prefill` (to the first token) and `decode` (first token to last). Where the engine
reports a request's speculative steps, `decode` says how they went: `meridian.spec.steps`,
`.drafts`, `.draft_tokens`, `.accepted_tokens` and `.accepted_counts` (how many drafts accepted 0,
1, 2, ... tokens). The node never records prompt or completion text: it does not know the tenant's
policy; the gateway does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from regional_node.server.metrics import RequestTimings
from telemetry import Tracing, extract_context

if TYPE_CHECKING:
    from regional_node.engine import RequestDelta
    from regional_node.server.generation import SpecTally

_OPERATIONS = {"chat": "chat", "completions": "text_completion"}


@dataclass
class RequestSpan:
    """One request's span and its start (the engine's timings are offsets from it)."""

    tracer: Tracer
    span: Span
    start_ns: int

    def finish(
        self,
        timings: RequestTimings | None,
        last: RequestDelta | None,
        outcome: str,
        speculation: SpecTally | None = None,
    ) -> None:
        span = self.span
        if timings is not None and span.is_recording():
            self._phases(timings, speculation)
        if last is not None:
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": last.prompt_tokens,
                    "gen_ai.usage.output_tokens": last.num_output_tokens,
                    "gen_ai.usage.cache_read.input_tokens": last.cached_tokens,
                }
            )
            if last.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [last.finish_reason])
        span.set_attribute("meridian.outcome", outcome)
        if outcome not in ("stop", "length"):
            span.set_status(Status(StatusCode.ERROR, outcome))
        end = None if timings is None else self.start_ns + _ns(timings.e2e)
        span.end(end_time=end)

    def _phases(self, timings: RequestTimings, speculation: SpecTally | None) -> None:
        parent = set_span_in_context(self.span)
        start = self.start_ns
        phases: list[tuple[str, float, float | None]] = []
        if timings.queue_wait is not None:
            phases.append(("queue", 0.0, timings.queue_wait))
            if timings.prefill is not None:
                phases.append(("prefill", timings.queue_wait, timings.prefill))
        if timings.ttft is not None:
            phases.append(("decode", timings.ttft, timings.decode))
        for name, offset, duration in phases:
            if duration is None:
                continue
            child = self.tracer.start_span(name, context=parent, start_time=start + _ns(offset))
            if name == "decode" and speculation is not None:
                child.set_attributes(
                    {
                        "meridian.spec.steps": speculation.steps,
                        "meridian.spec.drafts": speculation.drafts,
                        "meridian.spec.draft_tokens": speculation.draft_tokens,
                        "meridian.spec.accepted_tokens": speculation.accepted_tokens,
                        "meridian.spec.accepted_counts": speculation.accepted_counts,
                    }
                )
            child.end(end_time=start + _ns(offset + duration))


class NodeTracer:
    def __init__(self, tracing: Tracing, *, node_id: str, region: str) -> None:
        self.tracing = tracing
        self._tracer = tracing.tracer
        self._attributes = {"meridian.node": node_id, "meridian.region": region}

    def start(self, headers: Mapping[str, str], *, model: str, endpoint: str, request_id: str) -> RequestSpan:
        operation = _OPERATIONS.get(endpoint, endpoint)
        start_ns = time.time_ns()
        span = self._tracer.start_span(
            f"{operation} {model}",
            context=extract_context(headers),
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes={
                **self._attributes,
                "gen_ai.operation.name": operation,
                "gen_ai.request.model": model,
                "gen_ai.response.model": model,
                "gen_ai.response.id": request_id,
                "meridian.request_id": headers.get("x-request-id", ""),
            },
        )
        return RequestSpan(self._tracer, span, start_ns)


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)

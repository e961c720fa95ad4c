"""Tracing settings from the standard OpenTelemetry environment, and the tracer built from them.

Off by default. On when `OTEL_TRACES_EXPORTER` is `otlp` (or `console`), or when an OTLP endpoint
is set (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`); off whenever
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. When off, `start_tracing` returns None
and nothing of the SDK is built: the request paths check that one None and do nothing else.

Read here, from the mapping the process hands in (tests run gateways in-process with their own):

    OTEL_SDK_DISABLED                     true: no tracing, whatever else is set
    OTEL_TRACES_EXPORTER                  otlp | console | none
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT    full URL of the traces endpoint, used as is
    OTEL_EXPORTER_OTLP_ENDPOINT           base URL; `/v1/traces` is appended (default
                                          http://localhost:4318)
    OTEL_EXPORTER_OTLP_TRACES_HEADERS,
    OTEL_EXPORTER_OTLP_HEADERS            `key=value,key2=value2` (URL-encoded values), e.g. a
                                          collector's API key; never logged, never traced
    OTEL_SERVICE_NAME                     default meridian-gateway / meridian-node
    OTEL_TRACES_SAMPLER                   always_on, always_off, traceidratio, parentbased_always_on
                                          (default), parentbased_always_off, parentbased_traceidratio
    OTEL_TRACES_SAMPLER_ARG               the ratio for the *traceidratio samplers (default 1.0)
    OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_EXPORT_TIMEOUT               the batch span processor's (milliseconds, counts)

Spans leave through a BatchSpanProcessor (a background thread), so exporting never blocks a
request; a full queue drops spans rather than memory or latency. Propagation is W3C Trace Context
(`traceparent`, `tracestate`) only, explicit at both ends: nothing here touches OpenTelemetry's
global tracer provider or propagator, so several apps in one process (tests) stay apart.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Literal, get_args
from urllib.parse import unquote

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Span, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

Exporter = Literal["otlp", "console"]
SamplerName = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]
DEFAULT_ENDPOINT = "http://localhost:4318"
_PROPAGATOR = TraceContextTextMapPropagator()


class TracingError(ValueError):
    """An OTEL_* variable holds a value we cannot use; the message names it."""


@dataclass(frozen=True)
class TracingSettings:
    service_name: str
    exporter: Exporter = "otlp"
    endpoint: str = f"{DEFAULT_ENDPOINT}/v1/traces"
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    sampler: SamplerName = "parentbased_always_on"
    ratio: float = 1.0
    schedule_delay_ms: float | None = None  # None: the SDK's defaults
    max_queue_size: int | None = None
    max_export_batch_size: int | None = None
    export_timeout_ms: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, default_service: str) -> TracingSettings | None:
        """The settings the environment asks for, or None when tracing is off."""
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if exporter == "none" or (not exporter and not traces_endpoint and not base_endpoint):
            return None
        if exporter and exporter not in get_args(Exporter):
            raise TracingError(f"OTEL_TRACES_EXPORTER: expected otlp, console or none, got {exporter!r}")
        sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
        if sampler not in get_args(SamplerName):
            raise TracingError(
                f"OTEL_TRACES_SAMPLER: expected one of {', '.join(get_args(SamplerName))}, got {sampler!r}"
            )
        endpoint = traces_endpoint or (base_endpoint or DEFAULT_ENDPOINT).rstrip("/") + "/v1/traces"
        headers = _headers(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS") or _headers(
            env, "OTEL_EXPORTER_OTLP_HEADERS"
        )
        return cls(
            service_name=env.get("OTEL_SERVICE_NAME", "").strip() or default_service,
            exporter=exporter or "otlp",  # type: ignore[arg-type]
            endpoint=endpoint,
            headers=headers,
            sampler=sampler,  # type: ignore[arg-type]
            ratio=_ratio(env.get("OTEL_TRACES_SAMPLER_ARG")) if "traceidratio" in sampler else 1.0,
            schedule_delay_ms=_number(env, "OTEL_BSP_SCHEDULE_DELAY"),
            max_queue_size=_count(env, "OTEL_BSP_MAX_QUEUE_SIZE"),
            max_export_batch_size=_count(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
            export_timeout_ms=_number(env, "OTEL_BSP_EXPORT_TIMEOUT"),
        )

    def build_sampler(self) -> Sampler:
        root: Sampler = {
            "always_on": ALWAYS_ON,
            "always_off": ALWAYS_OFF,
            "traceidratio": TraceIdRatioBased(self.ratio),
        }[self.sampler.removeprefix("parentbased_")]
        return ParentBased(root) if self.sampler.startswith("parentbased_") else root


class Tracing:
    """One process's (or app's) tracer provider, exporter and tracer; `shutdown` flushes."""

    def __init__(self, settings: TracingSettings, exporter: SpanExporter | None = None) -> None:
        self.settings = settings
        self.provider = TracerProvider(
            sampler=settings.build_sampler(),
            resource=Resource.create({"service.name": settings.service_name}),
        )
        exporter = exporter or _exporter(settings)
        self.provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=settings.max_queue_size,
                schedule_delay_millis=settings.schedule_delay_ms,
                max_export_batch_size=settings.max_export_batch_size,
                export_timeout_millis=settings.export_timeout_ms,
            )
        )
        self.tracer: Tracer = self.provider.get_tracer("meridian")

    def shutdown(self) -> None:
        """Export what is queued (bounded by the export timeout) and stop the exporter thread."""
        self.provider.shutdown()


def start_tracing(env: Mapping[str, str], *, default_service: str) -> Tracing | None:
    settings = TracingSettings.from_env(env, default_service=default_service)
    if settings is None:
        return None
    logger.info(
        "tracing on: service %s, %s exporter to %s, sampler %s",
        settings.service_name,
        settings.exporter,
        settings.endpoint if settings.exporter == "otlp" else "stdout",
        settings.sampler,
    )
    return Tracing(settings)


def extract_context(headers: Mapping[str, str]) -> Context | None:
    """The caller's trace context from W3C `traceparent`/`tracestate`, None without a valid one."""
    if "traceparent" not in headers:
        return None
    return _PROPAGATOR.extract(headers)


def inject_context(span: Span, headers: MutableMapping[str, str]) -> None:
    """Write `span` as the parent for the next hop (W3C `traceparent`, `tracestate`)."""
    _PROPAGATOR.inject(headers, context=set_span_in_context(span))


def _exporter(settings: TracingSettings) -> SpanExporter:
    if settings.exporter == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.endpoint, headers=dict(settings.headers))


def _headers(env: Mapping[str, str], name: str) -> dict[str, str]:
    headers = {}
    for entry in env.get(name, "").split(","):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            # The value may be a credential: name the variable, never echo the entry.
            raise TracingError(f"{name}: expected key=value pairs separated by commas")
        headers[key.strip().lower()] = unquote(value.strip())
    return headers


def _ratio(value: str | None) -> float:
    if value is None or not value.strip():
        return 1.0
    try:
        ratio = float(value)
    except ValueError:
        raise TracingError(
            f"OTEL_TRACES_SAMPLER_ARG: expected a ratio between 0 and 1, got {value!r}"
        ) from None
    if not 0.0 <= ratio <= 1.0:
        raise TracingError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio between 0 and 1, got {value!r}")
    return ratio


def _number(env: Mapping[str, str], name: str) -> float | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise TracingError(f"{name}: expected a number of milliseconds, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise TracingError(f"{name}: expected a number of milliseconds, got {value!r}")
    return number


def _count(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) == 0:
        raise TracingError(f"{name}: expected a positive whole number, got {value!r}")
    return int(value)

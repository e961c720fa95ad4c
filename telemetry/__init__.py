"""What the gateway and the node share for OpenTelemetry traces: the standard `OTEL_*`
environment read into typed settings once, and the tracer built from them (telemetry/tracing.py).

Neutral like `protocol/`: it imports neither side, nor torch, nor Litestar.
"""

from telemetry.tracing import (
    Tracing,
    TracingError,
    TracingSettings,
    extract_context,
    inject_context,
    start_tracing,
)

__all__ = [
    "Tracing",
    "TracingError",
    "TracingSettings",
    "extract_context",
    "inject_context",
    "start_tracing",
]

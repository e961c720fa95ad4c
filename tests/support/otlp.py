"""A real OTLP/HTTP trace receiver for tests: POST /v1/traces with a protobuf
ExportTraceServiceRequest (opentelemetry-proto decodes it), spans kept in memory.

It answers as a collector does (200 with an empty ExportTraceServiceResponse), accepts gzip
bodies, and records the request headers of every export, so tests can check what exporters send.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.processes import free_port

SPAN_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


@dataclass
class OTLPReceiver:
    url: str  # the base URL: exporters post to {url}/v1/traces
    spans: list[ReceivedSpan] = field(default_factory=list)
    export_headers: list[dict[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, body: bytes, headers: dict[str, str]) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=SPAN_KINDS.get(span.kind, str(span.kind)),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            status_code=span.status.code,
                            status_message=span.status.message,
                        )
                    )
        with self._lock:
            self.spans.extend(received)
            self.export_headers.append(headers)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.snapshot() if span.trace_id == trace_id]

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """Poll until `predicate(all spans so far)`; AssertionError (with what came) after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.snapshot()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({f"{s.service}:{s.name}" for s in spans})
                raise AssertionError(
                    f"no matching spans within {timeout_s:g}s; received {len(spans)}: {names}"
                )
            time.sleep(0.05)


@contextmanager
def otlp_receiver() -> Iterator[OTLPReceiver]:
    port = free_port()
    receiver = OTLPReceiver(url=f"http://127.0.0.1:{port}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body, {k.lower(): v for k, v in self.headers.items()})
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def tracing_env(receiver: OTLPReceiver, service: str, **extra: str) -> dict[str, str]:
    """The OTEL_* environment that points a process's exporter at `receiver`, exporting fast."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        **extra,
    }

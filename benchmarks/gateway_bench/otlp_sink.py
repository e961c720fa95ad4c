"""A local OTLP/HTTP trace receiver for the tracing benchmark: it answers exports as a collector
does and counts the spans (decoded with opentelemetry-proto), so the run shows the traced gateway
really exported one trace per request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from gateway_bench.processes import free_port


@dataclass
class SpanCounts:
    exports: int = 0
    spans: int = 0
    server_spans: int = 0  # one per traced request
    bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        with self._lock:
            self.exports += 1
            self.spans += len(spans)
            self.server_spans += sum(1 for s in spans if s.kind == 2)
            self.bytes += len(body)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "exports": self.exports,
                "spans": self.spans,
                "server_spans": self.server_spans,
                "bytes": self.bytes,
            }


@contextmanager
def otlp_sink() -> Iterator[tuple[str, SpanCounts]]:
    """(base URL, counts); exporters post to {base URL}/v1/traces."""
    counts = SpanCounts()
    reply = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector: no connection per export

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            counts.add(body)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: Any) -> None:
            return None

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-sink", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", counts
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

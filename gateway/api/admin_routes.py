"""Operational endpoints: liveness with a fleet summary and readiness on the public listener;
Prometheus metrics (which name tenants) on the admin listener only (gateway.app.create_admin_app)."""

from __future__ import annotations

import os
from typing import Any

from litestar import Controller, Response, get

from gateway.metrics import GatewayMetrics
from gateway.safety.guard import SafetyGuard
from gateway.upstreams.fleet import Fleet

_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class AdminController(Controller):
    @get("/health")
    async def health(self, fleet: Fleet) -> dict[str, Any]:
        """Liveness: 200 while the gateway runs. Node counts tell an operator what routing sees;
        `pid` tells which process answered (`--workers N` runs N behind one port)."""
        nodes = fleet.snapshot().nodes
        return {
            "status": "ok",
            "pid": os.getpid(),
            "nodes": len(nodes),
            "healthy_nodes": sum(1 for n in nodes if n.healthy),
            "ejected": fleet.ejected(),
            # (node, model) pairs whose golden probes fail: routing leaves that model alone there.
            "probe_failed": fleet.probe_failed(),
        }

    @get("/ready")
    async def ready(self, safety: SafetyGuard) -> Response[dict[str, Any]]:
        """Readiness: 503 until the safety classifier (when one is configured) is loaded and
        warm, so a load balancer never sends traffic to a gateway that would fail it open or
        closed for want of a model."""
        classifier = safety.classifier
        if classifier is not None and not classifier.ready:
            why = getattr(classifier, "load_error", None) or "the safety classifier is loading"
            return Response({"ready": False, "reason": why}, status_code=503)
        return Response({"ready": True}, status_code=200)


class MetricsController(Controller):
    """The admin listener's routes: never registered on the public one (tenant names, tokens, cost)."""

    @get("/metrics")
    async def metrics(self, metrics: GatewayMetrics) -> Response[bytes]:
        return Response(metrics.render(), media_type=_PROMETHEUS_TEXT)

"""Operational endpoints: liveness with a fleet summary, and Prometheus metrics."""

from __future__ import annotations

import os
from typing import Any

from litestar import Controller, Response, get

from gateway.metrics import GatewayMetrics
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
        }

    @get("/metrics")
    async def metrics(self, metrics: GatewayMetrics) -> Response[bytes]:
        return Response(metrics.render(), media_type=_PROMETHEUS_TEXT)

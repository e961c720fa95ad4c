"""The regional node's Litestar app factory.

Models load in a background task started by the app's start-up hook (the weights are read in a
worker thread), so the port opens at once: /health answers during loading and /ready turns 200
when every model is loaded and warmed up. Shutdown cancels a load still in progress and stops
every engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Request, Response
from litestar.di import Provide

from http_server import ClientDisconnected
from regional_node.cpu_share import available_cpus, omp_num_threads
from regional_node.discovery import consul_presence
from regional_node.server.auth import bearer_guard
from regional_node.server.config import NodeConfig, effective_token
from regional_node.server.errors import handle_exception
from regional_node.server.metrics import NodeMetrics
from regional_node.server.pool import EngineLoader, ModelPool, engine_loader
from regional_node.server.routes import ROUTES
from regional_node.server.serving import NodeState
from regional_node.server.tracing import NodeTracer
from telemetry import start_tracing

logger = logging.getLogger(__name__)


def create_app(
    config: NodeConfig,
    *,
    loader: EngineLoader | None = None,
) -> Litestar:
    """A node app serving `config.models` on the engine `config.engine` names; `loader` is for
    tests' fake engines."""
    share = config.cpu.share(available_cpus(), omp_num_threads()) if config.cpu is not None else None
    pool = ModelPool(
        config.models, loader=loader or engine_loader(config.engine, share), warmup=config.warmup
    )
    tracing = start_tracing(os.environ, default_service="meridian-node")
    tracer = NodeTracer(tracing, node_id=config.node_id, region=config.region) if tracing else None
    node = NodeState(
        config=config,
        pool=pool,
        metrics=NodeMetrics(
            pool.stats,
            pool.cache_configs,
            probes=pool.probe_states,
            utilization=pool.utilization,
            models=config.model_names(),
        ),
        tracer=tracer,
    )
    token = effective_token(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        loading = asyncio.create_task(pool.load(), name="meridian-node-load-models")
        try:
            # Deregisters on the way out, before the engines stop.
            async with consul_presence(
                config, readiness=lambda: pool.ready, probes=pool.probe_states
            ) as presence:
                loading.add_done_callback(lambda _: presence.readiness_changed())
                yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await pool.shutdown()
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)  # flushes queued spans

    app = Litestar(
        route_handlers=ROUTES,
        dependencies={"node": Provide(lambda: node, sync_to_thread=False)},
        guards=[bearer_guard(token)] if token else [],
        exception_handlers={Exception: handle_exception, ClientDisconnected: _client_gone},
        lifespan=[lifespan],
        openapi_config=None,
    )
    app.state.node = node
    return app


def _client_gone(_: Request[Any, Any, Any], __: Exception) -> Response[bytes]:
    # Nobody reads this; 499 (nginx's "client closed request") keeps access logs honest.
    return Response(content=b"", status_code=499)

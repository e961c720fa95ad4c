"""`create_app(config)`: the gateway's parts, built from one config, owned by one Litestar app.

Nothing is global: every app has its own clients, metrics registry, policy store, directory,
quota gate and background tasks, started in its lifespan and stopped (in reverse) when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from litestar import Litestar
from litestar.di import Provide
from litestar.types import ControllerRouterHandler

from gateway.api import FRONT_DOORS, AdminController, MetricsController
from gateway.api.doors import any_door_errors
from gateway.batches.batches import Batches, build_batches
from gateway.call.pipeline import RequestPipeline
from gateway.config import GatewayConfig
from gateway.discovery.build import build_region_directory
from gateway.discovery.interface import RegionDirectory
from gateway.health import BreakerBoard, build_board, ejection
from gateway.health.probes import NodeProber
from gateway.http import ConnectionPool
from gateway.ledger.build import Ledger, build_ledger
from gateway.ledger.outbox import LocalOutbox
from gateway.metrics import GatewayMetrics
from gateway.observe import Observers
from gateway.policy import PolicyStore
from gateway.quota import build_quota_gate
from gateway.quota.interface import QuotaGate
from gateway.responses.store import ResponseStore
from gateway.safety.guard import SafetyGuard
from gateway.tracing import TracingObserver
from gateway.upstreams.failover import Forwarder
from gateway.upstreams.fleet import Fleet, ProviderSet
from gateway.upstreams.node import NodeUpstream
from gateway.upstreams.providers import build_providers
from router.types import TenantPolicy
from telemetry import Tracing, start_tracing

logger = logging.getLogger(__name__)


@dataclass
class Gateway:
    """Everything one gateway app owns."""

    config: GatewayConfig
    policies: PolicyStore
    directory: RegionDirectory
    quota: QuotaGate
    providers: ProviderSet
    clients: ConnectionPool  # requests to nodes: shared by all of them
    probe_client: ConnectionPool  # health probes, kept apart so probes never queue behind traffic
    prober: NodeProber
    board: BreakerBoard  # every upstream's circuit breaker (nodes and providers)
    fleet: Fleet
    metrics: GatewayMetrics
    pipeline: RequestPipeline
    safety: SafetyGuard  # content checks: the classifier loads in the background (see /ready)
    tracing: Tracing | None = None  # OTEL_* said to trace (telemetry/); None: off
    ledger: Ledger | None = None  # None: `ledger.enabled: false`
    responses: ResponseStore | None = None  # the Responses API's runs; None: built from config
    batches: Batches | None = None  # the Files and Batches APIs; None: `batches.enabled: false`

    def __post_init__(self) -> None:
        if self.responses is None:
            self.responses = ResponseStore(self.config.responses, self.pipeline)

    async def start(self) -> None:
        await self.safety.start()  # first: the classifier warms while the rest starts
        await self.policies.start()
        await self.directory.start()
        await self.board.start()
        start_quota = getattr(self.quota, "start", None)  # warms Redis: scripts, connections
        if start_quota is not None:
            await start_quota()
        if self.ledger is not None:
            await self.ledger.start()
        await self.prober.start()
        await self.pipeline.rollouts.start()
        if self.batches is not None:
            await self.batches.start()  # last: its runner sends requests down the pipeline
        nodes = self.directory.snapshot()
        ready = sum(1 for n in nodes if (r := self.prober.result(n.node_id)) is not None and r.ready)
        logger.info(
            "gateway started: %d tenants, %d nodes (%d ready)",
            len(self.policies.current()),
            len(nodes),
            ready,
        )

    async def stop(self) -> None:
        # Each step runs even if an earlier one fails: a half-stopped gateway leaks tasks.
        assert self.responses is not None
        for step in (
            *((self.batches.stop,) if self.batches is not None else ()),  # its lines' leases lapse
            self.responses.stop,  # first: its runs' streams close while the clients are up
            self.pipeline.rollouts.stop,
            self.prober.stop,
            self.directory.stop,
            self.policies.stop,
            self.board.aclose,
            self.providers.aclose,
            self.quota.close,
            # After the quota: the last settlements' in-process events are committed on the way out.
            *((self.ledger.stop,) if self.ledger is not None else ()),
            self.clients.aclose,
            self.probe_client.aclose,
            self.safety.stop,
            self._stop_tracing,
        ):
            try:
                await step()
            except Exception:
                logger.exception("error while stopping the gateway (%s)", getattr(step, "__qualname__", step))

    async def _stop_tracing(self) -> None:
        if self.tracing is not None:
            # Flushes queued spans over HTTP (bounded by the export timeout): off the event loop.
            await asyncio.to_thread(self.tracing.shutdown)

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        try:
            await self.start()
            yield
        finally:
            await self.stop()


def build_gateway(
    config: GatewayConfig,
    *,
    extra_policies: Sequence[TenantPolicy] = (),
    env: Mapping[str, str] | None = None,
    directory: RegionDirectory | None = None,
    quota: QuotaGate | None = None,
) -> Gateway:
    """Wire the parts; `directory` and `quota` may be injected (tests), else built from config."""
    env = os.environ if env is None else env
    metrics = GatewayMetrics()
    node_token = (env.get(config.node_auth.token_env) or "").strip() or None  # as the node strips it
    if node_token is None:
        logger.warning("%s is not set: requests to nodes carry no credential", config.node_auth.token_env)
    timeouts = config.timeouts
    clients = ConnectionPool(connect_timeout_s=timeouts.connect_s)
    probe_client = ConnectionPool(connect_timeout_s=timeouts.probe_s, max_connections=8, max_idle=8)
    directory = directory or build_region_directory(config.directory, registry=metrics.registry)

    auth_headers = {"authorization": f"Bearer {node_token}"} if node_token else {}
    prober = NodeProber(
        directory,
        probe_client,
        interval_s=timeouts.probe_interval_s,
        timeout_s=timeouts.probe_s,
        misses=timeouts.probe_misses,
        headers=auth_headers,
        metrics=metrics,
    )

    def node_upstream(node_id: str, url: str) -> NodeUpstream:
        return NodeUpstream(
            url,
            clients,
            node_token=node_token,
            read_timeout_s=timeouts.read_s,
            stream_idle_s=timeouts.stream_idle_s,
            name=node_id,
        )

    providers = build_providers(
        config.providers,
        env=env,
        metrics_registry=metrics.registry,
        source=config.source,  # its errors name the field from the root: `$.providers.endpoints[0]...`
    )
    # One board for nodes and providers; openings are shared across replicas through the
    # providers' Redis, else the quota's, if any.
    sharing = config.providers
    board = build_board(
        ejection(config.ejection.base_s, config.ejection.max_s),
        redis_url=sharing.redis_url or config.quota.redis_url,
        store_timeout_s=sharing.store_timeout_s,
        sync_interval_s=sharing.sync_interval_s,
        metrics_registry=metrics.registry,
    )
    fleet = Fleet(directory, prober, board, providers, node_upstream)
    outbox = LocalOutbox()
    if quota is None:
        quota = build_quota_gate(config.quota, outbox=outbox if config.ledger.enabled else None)
    policies = PolicyStore(config.policies, extra=extra_policies)
    # Loaded now, so a broken policy file stops start-up with its file and field named
    # (PolicyError) before any server is up; start() then only begins hot reloading.
    policies.load()
    ledger = None
    if config.ledger.enabled:
        ledger = build_ledger(config, outbox, lambda: (t.tenant_id for t in policies.current()), env)
    safety = SafetyGuard(config.safety, metrics.registry)
    tracing = start_tracing(env, default_service="meridian-gateway")
    parts = dict(
        config=config,
        policies=policies,
        quota=quota,
        fleet=fleet,
        metrics=metrics,
        safety=safety,
        prices=ledger.prices if ledger is not None else None,
    )
    forwarder = Forwarder(fleet, metrics, retry=config.retry, stream_idle_s=timeouts.stream_idle_s)
    # The request path's observers: metrics always; tracing when it is on (off, none of it exists).
    observer = metrics if tracing is None else Observers(metrics, TracingObserver(tracing.tracer))
    pipeline = RequestPipeline(forwarder=forwarder, observer=observer, **parts)
    batches = None
    if config.batches.enabled:
        batches = build_batches(config.batches, config.ledger.store, env, pipeline, policies, metrics)
    return Gateway(
        config=config,
        policies=policies,
        directory=directory,
        quota=quota,
        providers=providers,
        clients=clients,
        probe_client=probe_client,
        prober=prober,
        board=board,
        fleet=fleet,
        metrics=metrics,
        pipeline=pipeline,
        safety=safety,
        tracing=tracing,
        ledger=ledger,
        batches=batches,
    )


def _provide(value: Any) -> Provide:
    async def dependency() -> Any:
        return value

    return Provide(dependency, use_cache=True)


def create_app(
    config: GatewayConfig,
    *,
    extra_policies: Sequence[TenantPolicy] = (),
    env: Mapping[str, str] | None = None,
    gateway: Gateway | None = None,
    route_handlers: Sequence[ControllerRouterHandler] = FRONT_DOORS,
) -> Litestar:
    """The gateway app. `extra_policies` are in-memory tenants (e.g. `meridian up`'s demo tenant)."""
    gateway = gateway or build_gateway(config, extra_policies=extra_policies, env=env)
    return Litestar(
        route_handlers=list(route_handlers),
        dependencies={
            "pipeline": _provide(gateway.pipeline),
            "fleet": _provide(gateway.fleet),
            "metrics": _provide(gateway.metrics),
            "safety": _provide(gateway.safety),
            "ledger": _provide(gateway.ledger),
            "responses": _provide(gateway.responses),
            "batches": _provide(gateway.batches),
        },
        exception_handlers={Exception: any_door_errors},
        lifespan=[gateway.lifespan],
        state={"gateway": gateway},  # type: ignore[arg-type]
        # The OpenAPI document is our own (GET /openapi.json, gateway/api/openapi.py): Litestar
        # cannot see request bodies the front doors read themselves.
        openapi_config=None,
        # Logging is the process's business (the CLI configures it), not each app's.
        logging_config=None,
    )


def create_admin_app(gateway: Gateway) -> Litestar:
    """The admin listener's app (`admin:` in the config): `/metrics`, which names every tenant with
    its tokens and cost, and `/health` and `/ready` for probes that come the same way. It shares
    the public app's gateway and has no lifespan of its own: the public app starts and stops it."""
    return Litestar(
        route_handlers=[MetricsController, AdminController],
        dependencies={
            "metrics": _provide(gateway.metrics),
            "fleet": _provide(gateway.fleet),
            "safety": _provide(gateway.safety),
        },
        exception_handlers={Exception: any_door_errors},
        state={"gateway": gateway},  # type: ignore[arg-type]
        openapi_config=None,
        logging_config=None,
    )

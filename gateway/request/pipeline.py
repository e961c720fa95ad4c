"""The request path every front door shares: auth → plan → quota → route → forward → settle.

Front doors (the OpenAI routes here, an Anthropic `/v1/messages` elsewhere) parse their wire
format into the protocol's request structs and call `complete` or `stream`; they get OpenAI
response dicts or chunk dicts back and the response headers in `CallContext.headers`. Every
APIError raised here already carries those headers. Quota is settled exactly once per admitted
request, with real usage, however the request ends.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.policy import PolicyStore
from gateway.quota.interface import Admission, QuotaGate
from gateway.quota.lease import lease_keeper
from gateway.request.context import CallContext, header_safe
from gateway.request.plan import RequestPlan, plan_request
from gateway.runtime.tasks import run_shielded
from gateway.streaming.client_stream import ClientStream
from gateway.streaming.relay import StreamRelay
from gateway.upstreams.base import Endpoint
from gateway.upstreams.failover import BodyFor, Forwarder, OpenedStream
from gateway.upstreams.fleet import Fleet
from protocol import (
    APIError,
    AuthenticationError,
    ChatCompletionRequest,
    CompletionRequest,
    ServiceUnavailableError,
)
from router import route
from router.types import CatalogModel, RouteDecision, RouteRequest, TenantPolicy

logger = logging.getLogger(__name__)

ParsedRequest = ChatCompletionRequest | CompletionRequest


class RequestPipeline:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        policies: PolicyStore,
        quota: QuotaGate,
        fleet: Fleet,
        forwarder: Forwarder,
        metrics: GatewayMetrics,
    ) -> None:
        self._config = config
        self._catalog = config.catalog_models()
        self._policies = policies
        self._quota = quota
        self._fleet = fleet
        self._forwarder = forwarder
        self._metrics = metrics

    def start_call(self, headers: Mapping[str, str]) -> CallContext:
        return CallContext(
            request_id=f"req_{uuid.uuid4().hex}",
            client_region=headers.get("x-meridian-client-region") or None,
        )

    def authenticate(self, ctx: CallContext, authorization: str | None) -> TenantPolicy:
        scheme, _, key = (authorization or "").partition(" ")
        tenant = self._policies.current().authenticate(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise AuthenticationError(
                "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.", headers=ctx.headers
            )
        ctx.tenant = tenant
        return tenant

    def allowed_models(self, tenant: TenantPolicy) -> list[CatalogModel]:
        return [model for model in self._catalog if tenant.allows_model(model.name)]

    async def usage(self, tenant: TenantPolicy) -> dict[str, Any]:
        return await self._quota.usage(tenant)

    async def complete(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> dict[str, Any]:
        plan = self._plan(ctx, endpoint, request, body)
        admission = await self._admit(ctx, plan)
        # Charged only for what was served: a request that failed on every target gets its
        # tokens back (the request itself still counts against requests/min).
        actual_tokens = 0
        try:
            decision = self._route(ctx, plan.model.name, plan.affinity_key)
            async with lease_keeper(self._quota, admission):
                target, result, attempts = await self._forwarder.complete(
                    decision.targets,
                    endpoint,
                    lambda t: plan.body_for(t, stream=False),
                    self._node_headers(ctx),
                )
            ctx.served_by(target, attempts, self._fleet.route_label(target))
            usage = result.get("usage") or {}
            actual_tokens = int(usage.get("total_tokens") or plan.estimated_tokens)
            self.count_tokens(ctx, usage)
            result["model"] = target.model
            if not plan.wants_token_ids:
                for choice in result.get("choices") or []:
                    choice.pop("token_ids", None)
            return result
        finally:
            await self.settle(admission, actual_tokens)

    async def stream(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> ClientStream:
        """Opens the stream (failing over until a first chunk arrives) so that errors before the
        first byte are ordinary HTTP errors; the returned stream owns the quota admission."""
        plan = self._plan(ctx, endpoint, request, body)
        admission = await self._admit(ctx, plan)
        # The lease keeper renews the concurrency lease for as long as the stream lives; the
        # ClientStream's aclose() ends it.
        lease = AsyncExitStack()
        try:
            await lease.enter_async_context(lease_keeper(self._quota, admission))
            decision = self._route(ctx, plan.model.name, plan.affinity_key)
            opened = await self._forwarder.open_stream(
                decision.targets, endpoint, lambda t: plan.body_for(t, stream=True), self._node_headers(ctx)
            )
        except BaseException:
            await run_shielded(lease.aclose, what="stop lease keeper")
            await self.settle(admission, 0)  # nothing was served
            raise
        ctx.served_by(opened.target, opened.attempts, self._fleet.route_label(opened.target))
        self._metrics.ttft.labels(opened.target.model).observe(time.monotonic() - ctx.started)
        relay = StreamRelay(
            opened,
            plan=plan,
            forwarder=self._forwarder,
            metrics=self._metrics,
            reopen=lambda exclude, model, body_for: self._reopen(ctx, plan, exclude, model, body_for),
            idle_s=self._config.timeouts.stream_idle_s,
            max_continuations=self._config.retry.max_continuations,
        )
        return ClientStream(
            ctx, relay, lease, on_close=lambda: self._finish_stream(ctx, plan, admission, relay)
        )

    def failed(self, ctx: CallContext, error: Exception) -> APIError:
        """The client-facing error for anything raised on the path, with this call's headers."""
        if not isinstance(error, APIError):
            logger.error("request %s failed", ctx.request_id, exc_info=error)
            error = APIError("The gateway had an error while processing your request.", code="internal_error")
        error.headers = {**ctx.headers, **error.headers}
        self.record(ctx, str(error.status_code), stream=False)
        return error

    def record(self, ctx: CallContext, status: str, *, stream: bool) -> None:
        tenant = ctx.tenant.tenant_id if ctx.tenant else "-"
        self._metrics.requests.labels(tenant, ctx.model, ctx.region, status).inc()
        self._metrics.latency.labels(ctx.model, str(stream).lower()).observe(time.monotonic() - ctx.started)

    def _plan(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> RequestPlan:
        assert ctx.tenant is not None, "authenticate() before planning"
        plan = plan_request(endpoint, request, body, ctx.tenant, self._catalog, self._config.token_estimate)
        ctx.model = plan.model.name
        ctx.headers["x-meridian-model"] = plan.model.name
        return plan

    async def _admit(self, ctx: CallContext, plan: RequestPlan) -> Admission:
        assert ctx.tenant is not None
        admission = await self._quota.admit(
            ctx.tenant, request_id=ctx.request_id, estimated_tokens=plan.estimated_tokens
        )
        ctx.headers.update(admission.headers)
        return admission

    def _route(
        self, ctx: CallContext, model: str, affinity: str, exclude: frozenset[str] = frozenset()
    ) -> RouteDecision:
        assert ctx.tenant is not None
        request = RouteRequest(
            model=model,
            home_region=self._config.home_region,
            client_region=ctx.client_region,
            affinity_key=affinity,
            exclude=exclude,
        )
        decision = route(request, ctx.tenant, self._fleet.snapshot(), catalog=self._catalog)
        if not decision.targets:
            ctx.headers["x-meridian-route"] = header_safe(decision.reason)
            raise ServiceUnavailableError(
                f"No region allowed for this tenant can serve '{model}' right now: {decision.unavailable_reason}",
                code="no_region_available",
            )
        return decision

    async def _reopen(
        self, ctx: CallContext, plan: RequestPlan, exclude: frozenset[str], model: str, body_for: BodyFor
    ) -> OpenedStream:
        """A continuation: routed afresh (fresh health, same residency), nodes of `model` only."""
        decision = self._route(ctx, model, plan.affinity_key, exclude)
        targets = [t for t in decision.targets if t.kind == "node" and t.model == model]
        if not targets:
            raise ServiceUnavailableError(
                f"no other healthy node serving '{model}' is allowed for this tenant"
            )
        return await self._forwarder.open_stream(targets, plan.endpoint, body_for, self._node_headers(ctx))

    def _node_headers(self, ctx: CallContext) -> dict[str, str]:
        assert ctx.tenant is not None
        headers = {
            "x-request-id": ctx.request_id,
            "x-meridian-tenant": ctx.tenant.tenant_id,
            "x-meridian-priority": ctx.tenant.traffic_tier,
        }
        if ctx.tenant.prefix_cache == "isolated":
            # The node mixes the salt into its prefix-cache hashes: no cross-tenant cache hits.
            headers["x-meridian-cache-salt"] = ctx.tenant.tenant_id
        return headers

    def count_tokens(self, ctx: CallContext, usage: Mapping[str, Any]) -> None:
        tenant = ctx.tenant.tenant_id if ctx.tenant else "-"
        for kind in ("prompt", "completion"):
            count = int(usage.get(f"{kind}_tokens", 0) or 0)
            if count:
                self._metrics.tokens.labels(tenant, kind).inc(count)

    async def _finish_stream(
        self, ctx: CallContext, plan: RequestPlan, admission: Admission, relay: StreamRelay
    ) -> None:
        usage = relay.usage or {}
        actual = int(usage.get("total_tokens") or plan.prompt_tokens_estimate + relay.completion_tokens())
        self.count_tokens(ctx, usage)
        await self.settle(admission, actual)
        self.record(ctx, "stream_error" if relay.error else "200", stream=True)

    async def settle(self, admission: Admission, actual_tokens: int) -> None:
        await run_shielded(
            lambda: self._quota.settle(admission, actual_tokens=actual_tokens), what="quota settle"
        )

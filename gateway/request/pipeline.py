"""The request path every front door shares, top to bottom:

    authenticate → plan → admission → quota → route → failover → (cascade) → relay → settle

Front doors (gateway/api) parse their wire format into the protocol's request structs and call
`complete` or `stream`; they get OpenAI response dicts or a `ServedStream` of chunk dicts back,
and the response headers in `CallContext.headers`. Calls only go down: the relay reports a broken
stream and this module decides whether and where it continues. Admission (gateway/admission) comes
before the quota and any upstream call, so a request it sheds costs almost nothing and holds no
reservation; it may also degrade the request to the small tier. Errors are raised as they are
(protocol APIErrors for invalid requests, domain errors for quota and routing); the API edge maps
them to HTTP once. Quota is settled exactly once per admitted request, with real usage, however
the request ends. An `auto` request that starts on the small tier passes the confidence cascade
between failover and relay (`_cascade`): it may be served by the large tier instead. Every call's
latency breakdown is kept in `CallContext.latency`. With tracing on, gateway/tracing.py's
TracedPipeline subclasses this class and wraps its stages (authenticate, _plan, _admit_load,
_admit_quota, _route, _cascade, _continue, _settle, _settle_stream, record) in spans: a new stage
gets its span there.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack
from typing import Any

from gateway.admission import AdmissionController, Ticket
from gateway.admission.errors import Overloaded
from gateway.config import GatewayConfig
from gateway.escalation import ThrashGuard
from gateway.escalation.cascade import Escalated, probe, release
from gateway.ledger.event import encode_events
from gateway.ledger.prices import PriceTable
from gateway.ledger.record import api_key_id, escalated_event, usage_event
from gateway.metrics import GatewayMetrics
from gateway.policy import PolicyStore
from gateway.quota.interface import Admission, QuotaGate
from gateway.quota.lease import LeaseKeeper
from gateway.request.context import SESSION_HEADER, CallContext, header_safe
from gateway.request.errors import NoRouteError
from gateway.request.plan import RequestPlan, plan_request
from gateway.request.rollouts import RolloutPlans
from gateway.runtime.tasks import run_shielded
from gateway.safety.guard import CallSafety, SafetyGuard
from gateway.streaming.collect import collect
from gateway.streaming.continuation import Continue, Stop, decide
from gateway.streaming.relay import StreamRelay, error_event
from gateway.streaming.served import ServedStream
from gateway.upstreams.base import Endpoint, UpstreamError
from gateway.upstreams.errors import UpstreamRejected, UpstreamsExhausted
from gateway.upstreams.failover import Forwarder, OpenedStream
from gateway.upstreams.fleet import Fleet
from protocol import AuthenticationError, ChatCompletionRequest, CompletionRequest
from protocol.prefix_cache import conversation_of
from protocol.timing import TIMINGS_FIELD, timing_from_wire
from router import AUTO_MODEL, auto_family, escalation_model, judge, route, rule_for
from router.types import CatalogModel, RouteRequest, Target, TenantPolicy

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
        safety: SafetyGuard | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        """`prices`: None when the ledger is off (no usage events are written)."""
        self._config = config
        # Without one given, no tenant's checks have a classifier or an audit file (metrics only).
        self._safety = safety or SafetyGuard(config.safety, metrics.registry)
        self._prices = prices
        self._catalog = config.catalog_models()
        self._policies = policies
        self._quota = quota
        self._fleet = fleet
        self._failover = forwarder
        self._metrics = metrics
        self.admission = AdmissionController(config.admission, fleet.snapshot, self._catalog, metrics)
        # Reloaded from the config file while running (instant rollback); the app starts its watch.
        self.rollouts = RolloutPlans(
            config, fleet.snapshot, metrics.registry, interval_s=config.timeouts.probe_interval_s
        )
        self._auto = config.auto.to_router()
        # Escalations per (tenant, auto family): the cascade records, planning reads.
        self.escalations = ThrashGuard(
            config.auto.thrash.to_rule(), rate=config.auto.escalation_rate.to_rule()
        )

    # -- the two request shapes ---------------------------------------------------------------

    async def complete(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> dict[str, Any]:
        safety = self._begin_safety(ctx)
        body = safety.screen_input(endpoint, body)
        plan, ticket = await self._admit_load(ctx, self._plan(ctx, endpoint, request, body))
        admission = await self._admit_quota(ctx, plan, ticket)
        # Charged only for what was served: a request that failed on every target, or whose input
        # the classifier blocked, gets its tokens back (the request still counts against requests/min).
        served_tokens = 0
        usage: dict[str, Any] | None = None
        try:
            targets = self._route(ctx, plan)
            async with LeaseKeeper(self._quota, admission):
                if plan.cascade is not None:
                    plan, target, result, attempts = await safety.while_checking_input(
                        self._complete_by_stream(ctx, plan, targets)
                    )
                else:
                    target, result, attempts = await safety.while_checking_input(
                        self._complete_once(ctx, plan, targets)
                    )
                await safety.input_verdict()
            ctx.served_by(target, attempts, self._fleet.route_label(target))
            usage = result.get("usage") or {}
            served_tokens = int(usage.get("total_tokens") or plan.estimated_tokens) + _wasted(ctx)
            self._count_tokens(ctx, usage)
            result["model"] = target.model
            if target.version:
                result["system_fingerprint"] = target.version
            if not plan.wants_token_ids:
                for choice in result.get("choices") or []:
                    choice.pop("token_ids", None)
            return await safety.check_output(endpoint, result)
        except UpstreamsExhausted as exc:
            self._refused_by_upstreams(ctx, exc)
            raise
        finally:
            ticket.release()
            safety.finish()
            status = "failed" if usage is None else "ok"
            fallback = (plan.prompt_tokens_estimate, 0) if usage == {} else (0, 0)
            event = self._usage_event(ctx, plan, usage or None, status, fallback=fallback, stream=False)
            await self._settle(admission, served_tokens or _wasted(ctx), event)

    async def stream(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> ServedStream:
        """Opens the stream (failing over until a first chunk arrives), so that errors before the
        first byte are ordinary HTTP errors. What the stream holds is registered on one exit
        stack as it is taken; the returned ServedStream owns it from then on."""
        safety = self._begin_safety(ctx)
        body = safety.screen_input(endpoint, body)
        plan, ticket = await self._admit_load(ctx, self._plan(ctx, endpoint, request, body))
        admission = await self._admit_quota(ctx, plan, ticket)
        owned = AsyncExitStack()
        relay: StreamRelay | None = None

        async def settle() -> None:
            await self._settle_stream(ctx, plan, admission, relay)

        try:
            owned.callback(safety.finish)
            owned.push_async_callback(settle)
            owned.callback(ticket.release)
            await owned.enter_async_context(LeaseKeeper(self._quota, admission))
            opened = await safety.while_checking_input(self._open(ctx, plan, self._route(ctx, plan)))
            try:
                await safety.input_verdict()  # no byte reaches the client before the input passed
            except BaseException:
                await opened.aclose()  # the node aborts the request and frees its KV blocks
                raise
            ticket.started()  # the first chunk is here: the prompt has left the node's queue
            if plan.cascade is not None:
                plan, opened = await self._cascade(ctx, plan, opened)
            relay = StreamRelay(opened, plan, ctx.latency)
            owned.push_async_callback(relay.aclose)
        except BaseException as exc:
            if isinstance(exc, UpstreamsExhausted):
                self._refused_by_upstreams(ctx, exc)
            # Cancelled too (the client left while we failed over): the release must still run.
            await run_shielded(owned.aclose, what="release a stream that failed to open")
            raise
        ctx.served_by(opened.target, opened.attempts, self._fleet.route_label(opened.target))
        ctx.headers["server-timing"] = ctx.latency.at_first_byte().server_timing()
        self._metrics.ttft.labels(opened.target.model).observe(time.monotonic() - ctx.started)
        return ServedStream(ctx, safety.guard_stream(endpoint, self._relay(ctx, plan, relay)), owned)

    # -- stages ---------------------------------------------------------------------------------

    def start_call(self, headers: Mapping[str, str]) -> CallContext:
        return CallContext(
            request_id=f"req_{os.urandom(16).hex()}",  # uuid4's randomness, without the UUID object
            client_region=headers.get("x-meridian-client-region") or None,
            session_key=headers.get(SESSION_HEADER, ""),
        )

    def authenticate(self, ctx: CallContext, authorization: str | None) -> TenantPolicy:
        scheme, _, key = (authorization or "").partition(" ")
        tenant = self._policies.current().authenticate(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise AuthenticationError("Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'.")
        ctx.tenant = tenant
        ctx.api_key_id = api_key_id(key.strip())
        return tenant

    def _refused_by_upstreams(self, ctx: CallContext, exc: UpstreamsExhausted) -> None:
        """Every upstream refused an interactive request for capacity: batch steps back."""
        if exc.all_at_capacity() and ctx.tenant is not None and ctx.tenant.traffic_tier == "interactive":
            self.admission.interactive_pressed()

    def _begin_safety(self, ctx: CallContext) -> CallSafety:
        """The tenant's content policy as of now (a reload mid-call does not change it)."""
        assert ctx.tenant is not None, "authenticate() before the content checks"
        tenant = ctx.tenant.tenant_id
        ctx.safety = self._safety.begin(ctx.request_id, tenant, self._policies.current().safety_for(tenant))
        return ctx.safety

    def _plan(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> RequestPlan:
        assert ctx.tenant is not None, "authenticate() before planning"
        tenant = ctx.tenant
        family = auto_family(tenant, self._catalog) if request.model == AUTO_MODEL else None
        history = self.escalations.history(tenant.tenant_id, family, ctx.request_id)
        plan = plan_request(
            endpoint, request, body, tenant, self._catalog, self._config.token_estimate, self._auto, history
        )
        if plan.auto is not None:
            self._metrics.labelled(
                self._metrics.auto_decisions, tenant.tenant_id, plan.auto.tier, plan.auto.rule
            ).inc()
            ctx.route_prefix = f"auto:{plan.auto.tier};{plan.auto.reason};"
            plan = self._with_cascade(plan, tenant)
        ctx.model = plan.model.name
        ctx.headers["x-meridian-model"] = plan.model.name
        return plan

    def _with_cascade(self, plan: RequestPlan, tenant: TenantPolicy) -> RequestPlan:
        """An `auto` request that starts on the small tier is judged on its first tokens, if the
        cascade is on, the tenant may use a large model, and it asks for one answer (n = 1)."""
        settings = self._config.auto.escalation
        if not settings.enabled or plan.auto is None or plan.model.tier != "small" or plan.n != 1:
            return plan
        large = escalation_model(tenant, self._catalog)
        if large is None:
            return plan
        rule = rule_for(settings.to_router(), tenant.escalation)
        return dataclasses.replace(plan, cascade=rule, escalate_to=large)

    async def _cascade(
        self, ctx: CallContext, plan: RequestPlan, opened: OpenedStream
    ) -> tuple[RequestPlan, OpenedStream]:
        """The confidence cascade (gateway/escalation/cascade.py): the small model's first K tokens
        are read and held; it keeps the request (the held tokens go out first), or the large model
        serves it from the start and the small request is aborted. The large model is only asked
        when its pool admits the request and an upstream opens: else the small answer stands."""
        assert ctx.tenant is not None and plan.cascade is not None and plan.escalate_to is not None
        tenant, family, large = ctx.tenant.tenant_id, plan.model.name, plan.escalate_to
        try:
            found = await probe(opened, plan.cascade.k_tokens)
        except BaseException:
            await run_shielded(opened.aclose, what="close the small tier's stream")
            raise
        if not found.judgeable:
            # A break is continued by the relay as usual; an upstream without logprobs keeps it.
            unjudged = "unjudged=upstream_broke" if found.error is not None else "unjudged=no_logprobs"
            ctx.route_prefix += f"{unjudged};"
            return plan, release(opened, found)
        verdict = judge(found.logprobs, plan.cascade)
        self.escalations.record(tenant, family, escalated=verdict.escalate)
        metrics = self._metrics
        metrics.labelled(metrics.auto_escalation_rate, tenant, family).set(
            self.escalations.history(tenant, family).rate
        )
        if not verdict.escalate:
            ctx.route_prefix += f"{verdict.reason};"
            return plan, release(opened, found)
        escalated = dataclasses.replace(plan, model=large, cascade=None, escalate_to=None)
        try:
            served = await self._open_large(ctx, escalated)
        except (Overloaded, NoRouteError, UpstreamsExhausted, UpstreamRejected) as exc:
            # The small model's answer is better than none.
            metrics.labelled(metrics.auto_escalations, tenant, family, "large_unavailable").inc()
            ctx.route_prefix += f"{verdict.reason};escalation_failed={type(exc).__name__};"
            return plan, release(opened, found)
        except BaseException:
            await run_shielded(opened.aclose, what="close the small tier's stream")
            raise
        await run_shielded(opened.aclose, what="abort the small tier's request")
        ctx.escalation = Escalated(
            model=family,
            target=opened.target,
            prompt_tokens=plan.prompt_tokens_estimate,
            completion_tokens=found.tokens,
            reason=verdict.reason,
        )
        metrics.labelled(metrics.auto_escalations, tenant, family, "low_confidence").inc()
        metrics.labelled(metrics.auto_wasted_tokens, tenant, family, "prompt").inc(
            plan.prompt_tokens_estimate
        )
        metrics.labelled(metrics.auto_wasted_tokens, tenant, family, "completion").inc(found.tokens)
        ctx.route_prefix = f"auto:small->large;{verdict.reason};"
        ctx.model = large.name
        ctx.headers["x-meridian-model"] = large.name
        return escalated, served

    async def _open_large(self, ctx: CallContext, plan: RequestPlan) -> OpenedStream:
        """The escalated request's stream: admitted on the large pool (a degraded admission means
        the large tier is over its target: no escalation), routed with the tenant's residency."""
        assert ctx.tenant is not None
        admitted = await self.admission.admit(ctx.tenant, plan.model, plan.prompt_tokens_estimate)
        try:
            if admitted.degraded_from is not None:
                raise Overloaded(
                    model=plan.model.name, tier=ctx.tenant.traffic_tier, reason="over_target", retry_after_s=1
                )
            opened = await self._open(ctx, plan, self._route(ctx, plan))
            admitted.ticket.started()  # _open returns with the first chunk
            return opened
        finally:
            admitted.ticket.release()

    async def _open(self, ctx: CallContext, plan: RequestPlan, targets: tuple[Target, ...]) -> OpenedStream:
        since = time.monotonic()
        try:
            return await self._failover.open_stream(
                targets, plan.endpoint, lambda t: plan.body_for(t, stream=True), self._node_headers(ctx)
            )
        finally:
            ctx.latency.waited_since(since)

    async def _complete_once(
        self, ctx: CallContext, plan: RequestPlan, targets: tuple[Target, ...]
    ) -> tuple[Target, dict[str, Any], int]:
        since = time.monotonic()
        try:
            target, result, attempts = await self._failover.complete(
                targets, plan.endpoint, lambda t: plan.body_for(t, stream=False), self._node_headers(ctx)
            )
        finally:
            ctx.latency.waited_since(since)
        ctx.latency.answered(timing_from_wire(result.pop(TIMINGS_FIELD, None)))
        return target, result, attempts

    async def _complete_by_stream(
        self, ctx: CallContext, plan: RequestPlan, targets: tuple[Target, ...]
    ) -> tuple[RequestPlan, Target, dict[str, Any], int]:
        """A non-streamed request the cascade judges: streamed from the small model so that an
        escalation aborts it after K tokens, not after the whole answer; collected into one
        response (a break mid-way continues elsewhere, as for a client's stream)."""
        plan, opened = await self._cascade(ctx, plan, await self._open(ctx, plan, targets))
        relay = StreamRelay(opened, plan, ctx.latency)
        try:
            chunks = [chunk async for chunk in self._relay(ctx, plan, relay)]
        finally:
            await run_shielded(relay.aclose, what="close a collected stream")
        if ctx.stream_error is not None:
            raise UpstreamsExhausted(
                plan.model.name, [(relay.target, UpstreamError(ctx.stream_error, status_code=502))]
            )
        result = collect(plan.endpoint, [c for c in chunks if "error" not in c], relay.usage)
        return plan, opened.target, result, opened.attempts

    async def _admit_load(self, ctx: CallContext, plan: RequestPlan) -> tuple[RequestPlan, Ticket]:
        """Admission against the tier's target (may wait in the gateway queue; raises Overloaded).
        A degraded request is planned for the small tier from here on, continuations included."""
        assert ctx.tenant is not None
        admitted = await self.admission.admit(ctx.tenant, plan.model, plan.prompt_tokens_estimate)
        if admitted.degraded_from is not None:
            plan = dataclasses.replace(plan, model=admitted.model, degraded_from=admitted.degraded_from)
            ctx.model = plan.model.name
            ctx.headers["x-meridian-model"] = plan.model.name
        return plan, admitted.ticket

    async def _admit_quota(self, ctx: CallContext, plan: RequestPlan, ticket: Ticket) -> Admission:
        assert ctx.tenant is not None
        try:
            admission = await self._quota.admit(
                ctx.tenant, request_id=ctx.request_id, estimated_tokens=plan.estimated_tokens
            )
        except BaseException:
            ticket.release()
            raise
        self._metrics.labelled(
            self._metrics.quota_admissions, ctx.tenant.tenant_id, admission.store_state.source
        ).inc()
        ctx.headers.update(admission.headers)
        return admission

    def _route(
        self,
        ctx: CallContext,
        plan: RequestPlan,
        exclude: frozenset[str] = frozenset(),
        *,
        version: str | None = None,
    ) -> tuple[Target, ...]:
        """`version`: only targets serving that version of the model (a continuation's pin)."""
        assert ctx.tenant is not None
        model = plan.model.name
        user = plan.base_body.get("user")
        request = RouteRequest(
            model=model,
            home_region=self._config.home_region,
            client_region=ctx.client_region,
            affinity_key=plan.affinity_key,
            exclude=exclude,
            degraded_from=plan.degraded_from,
            # The rollout's sticky key: the session header, else the OpenAI `user` field.
            session_key=ctx.session_key or (user if isinstance(user, str) else ""),
            version=version,
            # What the cost-aware router needs to find the nodes holding this prompt's prefixes.
            conversation=conversation_of(plan.base_body.get("messages") or ()),
            prompt_tokens=plan.prompt_tokens_estimate,
        )
        decision = route(
            request,
            ctx.tenant,
            self._fleet.snapshot(),
            catalog=self._catalog,
            rollouts=self.rollouts.current(),
        )
        if not decision.targets:
            ctx.headers["x-meridian-route"] = header_safe(decision.reason)
            raise NoRouteError(model, decision.unavailable_reason or decision.reason)
        return decision.targets

    async def _relay(
        self, ctx: CallContext, plan: RequestPlan, relay: StreamRelay
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The client's chunks: relayed from one upstream after another until the stream ends.
        The relay reports a break; the continuation rule decides; a continuation is routed here."""
        failed: set[str] = set()
        while True:
            async for chunk in relay.chunks():
                if relay.target.version:
                    chunk["system_fingerprint"] = relay.target.version
                yield chunk
            report = relay.broken
            if report is None:
                return
            self._failover.record_failure(report.target, report.error, outcome="broken")
            failed.add(report.target.target_id)
            step = decide(
                plan,
                report,
                continuations=relay.continuations,
                max_continuations=self._config.retry.max_continuations,
            )
            if isinstance(step, Continue):
                broke = f"The stream from {report.target.target_id} broke ({report.error.message})"
                try:
                    opened = await self._continue(
                        ctx, plan, step, exclude=frozenset(failed), version=report.target.version
                    )
                except NoRouteError as exc:
                    step = Stop("error", f"{broke} and no other upstream could continue it: {exc.why}.")
                except (UpstreamsExhausted, UpstreamRejected) as exc:
                    step = Stop("error", f"{broke} and could not be continued: {exc}")
                else:
                    self._metrics.failovers.labels("continuation").inc()
                    relay.resume(opened, step)
                    continue
            if step.ending == "error":
                ctx.stream_error = step.why
                yield error_event(step.why)
            return

    async def _continue(
        self, ctx: CallContext, plan: RequestPlan, step: Continue, *, exclude: frozenset[str], version: str
    ) -> OpenedStream:
        """A continuation: routed afresh (fresh health, same residency, the upstreams this stream
        broke on excluded), to upstreams of the same model and the same `version` (the stream's;
        "": unversioned) that can take a token-exact continuation. NoRouteError says why there is
        none."""
        model = plan.model.name
        targets = [
            t
            for t in self._route(ctx, plan, exclude, version=version)
            if t.model == model and t.version == version and self._fleet.upstream_for(t).token_exact
        ]
        if not targets:
            raise NoRouteError(
                model, f"the upstreams left for '{model}' cannot continue a stream token-exactly"
            )
        since = time.monotonic()
        try:
            return await self._failover.open_stream(
                targets, plan.endpoint, lambda t: step.body(plan, t), self._node_headers(ctx)
            )
        finally:
            ctx.latency.waited_since(since)

    async def _settle(self, admission: Admission, served_tokens: int, event: bytes | None) -> None:
        await run_shielded(
            lambda: self._quota.settle(admission, actual_tokens=served_tokens, event=event),
            what="quota settle",
        )

    async def _settle_stream(
        self, ctx: CallContext, plan: RequestPlan, admission: Admission, relay: StreamRelay | None
    ) -> None:
        """Runs as the stream's exit stack unwinds, which its owner already shields."""
        ctx.latency.finish()  # the stream is over: its usage event has the whole breakdown
        if relay is None:  # failed before the first chunk: nothing was served
            event = self._usage_event(ctx, plan, None, "failed", stream=True)
            await self._quota.settle(admission, actual_tokens=_wasted(ctx), event=event)
            return
        usage = relay.usage or {}
        served = int(usage.get("total_tokens") or plan.prompt_tokens_estimate + relay.completion_tokens())
        served += _wasted(ctx)
        self._count_tokens(ctx, usage)
        status = "stream_error" if ctx.stream_error else "ok" if relay.finished else "incomplete"
        event = self._usage_event(
            ctx,
            plan,
            relay.usage,
            status,
            fallback=(plan.prompt_tokens_estimate, relay.completion_tokens()),
            stream=True,
            continuations=relay.continuations,
        )
        await self._quota.settle(admission, actual_tokens=served, event=event)
        self.record(ctx, "stream_error" if ctx.stream_error else "200", stream=True)

    def _usage_event(
        self,
        ctx: CallContext,
        plan: RequestPlan,
        usage: Mapping[str, Any] | None,
        status: str,
        *,
        fallback: tuple[int, int] = (0, 0),
        stream: bool,
        continuations: int = 0,
    ) -> bytes | None:
        """The request's usage event (gateway/ledger), priced; its cost is counted here too."""
        if self._prices is None or ctx.tenant is None:
            return None
        event = usage_event(
            ctx,
            model_requested=plan.model.name,
            degraded=plan.degraded_from is not None,
            usage=usage,
            fallback_counts=fallback,
            status=status,
            stream=stream,
            continuations=continuations,
            prices=self._prices,
            now_s=time.time(),
        )
        events = [event]
        if ctx.escalation is not None:
            events.append(escalated_event(event, ctx.escalation, self._prices))
        for each in events:
            if each.cost_usd:
                self._metrics.labelled(self._metrics.cost, each.tenant_id, each.model).inc(each.cost_usd)
        return encode_events(events)

    # -- what the front doors read -------------------------------------------------------------

    def allowed_models(self, tenant: TenantPolicy) -> list[CatalogModel]:
        return [model for model in self._catalog if tenant.allows_model(model.name)]

    async def usage(self, tenant: TenantPolicy) -> dict[str, Any]:
        return await self._quota.usage(tenant)

    def record(self, ctx: CallContext, status: str, *, stream: bool) -> None:
        """The call ended (answered, failed, or its stream closed): counted, timed, and a
        non-streamed answer gets its Server-Timing header."""
        latency = ctx.latency
        latency.finish()
        tenant = ctx.tenant.tenant_id if ctx.tenant else "-"
        streamed = "true" if stream else "false"
        metrics = self._metrics
        metrics.labelled(metrics.requests, tenant, ctx.model, ctx.region, status).inc()
        metrics.labelled(metrics.latency, ctx.model, streamed).observe(latency.total_s)
        metrics.labelled(metrics.overhead, ctx.model, streamed).observe(latency.gateway_s)
        if not stream:
            ctx.headers["server-timing"] = latency.timing().server_timing()

    def _count_tokens(self, ctx: CallContext, usage: Mapping[str, Any]) -> None:
        tenant = ctx.tenant.tenant_id if ctx.tenant else "-"
        for kind in ("prompt", "completion"):
            count = int(usage.get(f"{kind}_tokens", 0) or 0)
            if count:
                self._metrics.labelled(self._metrics.tokens, tenant, kind).inc(count)

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


def _wasted(ctx: CallContext) -> int:
    """Tokens an escalated request used on the small tier: charged with the large tier's."""
    escalated = ctx.escalation
    return 0 if escalated is None else escalated.prompt_tokens + escalated.completion_tokens

"""The request path every front door shares, top to bottom:

    authenticate → plan → admission → quota → route → failover → (cascade) → relay → settle

Front doors (gateway/api) parse their wire format into the protocol's request structs and call
`complete` or `stream`; they get a typed `Completion` (protocol/chunk.py) or a `ServedStream` of
typed chunks back, and the response headers in `CallContext.headers`. The token-count doors call
`count_tokens`, the same path without admission, tokens or usage. Calls only go down: the
relay reports a broken stream and this module decides whether and where it continues; a stream is
one generator of this module's, whose own `finally` settles it when the front door closes it.
Admission (gateway/admission) comes before the quota and any upstream call, so a request it sheds
costs almost nothing and holds no reservation; it may also degrade the request to the small tier.
Errors are raised as they are (protocol APIErrors for invalid requests, domain errors for quota
and routing); the API edge maps them to HTTP once. Quota is settled exactly once per admitted
request, with real usage, however the request ends. An `auto` request that starts on the small
tier passes the confidence cascade between failover and relay (`_cascade`): it may be served by
the large tier instead. Every call's latency breakdown is kept in `CallContext.latency`.

Observation (gateway/observe.py): each stage is reported to the call's observer, and the
stage an inner step belongs to is passed down as a parameter; tracing and metrics are observers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from gateway.admission import AdmissionController, Ticket
from gateway.admission.errors import Overloaded
from gateway.call.collect import collect
from gateway.call.context import NO_OUTCOME, SESSION_HEADER, CallContext, Outcome, header_safe
from gateway.call.continuation import Continue, Stop, decide
from gateway.call.errors import NoRouteError
from gateway.call.plan import RequestPlan, plan_request
from gateway.call.relay import StreamRelay
from gateway.call.rollouts import RolloutPlans
from gateway.call.served import ServedStream
from gateway.call.usage import escalated_event, usage_event
from gateway.config import GatewayConfig
from gateway.escalation import ThrashGuard
from gateway.escalation.cascade import Escalated, probe, release
from gateway.ledger.event import encode_events
from gateway.ledger.prices import PriceTable
from gateway.metrics import GatewayMetrics
from gateway.observe import Ended, Observer, Stage, chunk_text
from gateway.policy import PolicyStore
from gateway.policy.keys import api_key_id
from gateway.quota.interface import Admission, QuotaGate
from gateway.quota.lease import LeaseKeeper
from gateway.runtime.tasks import run_shielded
from gateway.safety.guard import CallSafety, SafetyGuard
from gateway.upstreams.base import Endpoint, UpstreamError
from gateway.upstreams.errors import UpstreamRejected, UpstreamsExhausted
from gateway.upstreams.failover import Forwarder, OpenedStream
from gateway.upstreams.fleet import Fleet
from protocol import AuthenticationError, ChatCompletionRequest, CompletionRequest, InvalidRequestError
from protocol.capabilities import DESCRIBED
from protocol.chunk import Chunk, Completion, Streamed, StreamFailed, Usage, usage_of
from protocol.timing import timing_from_wire
from router import AUTO_MODEL, auto_family, escalation_model, judge, route, rule_for
from router.types import CatalogModel, RouteRequest, Target, TenantPolicy

logger = logging.getLogger(__name__)

ParsedRequest = ChatCompletionRequest | CompletionRequest
_OPERATIONS: dict[str, str] = {"chat": "chat", "completions": "text_completion"}


class RequestPipeline:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        observer: Observer | None = None,
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
        # Without one given, metrics alone observe the calls.
        self._observer = observer or metrics
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
    ) -> Completion:
        safety = self._begin_safety(ctx)
        body = safety.screen_input(endpoint, body)
        plan, ticket = await self._admit_load(ctx, self._plan(ctx, endpoint, request, body))
        admission = await self._admit_quota(ctx, plan.estimated_tokens, ticket)
        # Charged only for what was served: a request that failed on every target, or whose input
        # the classifier blocked, gets its tokens back (the request still counts against requests/min).
        served_tokens = 0
        answered = False
        usage: Usage | None = None
        outcome: Outcome | None = None  # set once the answer is the client's
        try:
            targets = self._route(ctx, plan, ctx.observed)
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
            ctx.served_by(target, attempts, plan.route_prefix, self._fleet.route_label(target))
            answered = True
            usage = usage_of(result.usage)
            served_tokens = (usage.total_tokens if usage else 0) or plan.estimated_tokens
            served_tokens += _wasted(ctx)
            result.model = target.model
            if target.version:
                result.system_fingerprint = target.version
            if not plan.wants_token_ids:
                for choice in result.choices:
                    choice.token_ids = UNSET
            result = await safety.check_output(result)
            finished = tuple(c.finish_reason for c in result.choices if c.finish_reason)
            if ctx.observed.wants_text:
                ctx.observed.answered_text("".join(c.content() for c in result.choices))
            outcome = Outcome(usage=usage, finish_reasons=finished)
            return result
        except UpstreamsExhausted as exc:
            self._refused_by_upstreams(ctx, exc)
            raise
        finally:
            ticket.release()
            safety.finish()
            status = "ok" if answered else "failed"
            fallback = (plan.prompt_tokens_estimate, 0) if answered and usage is None else (0, 0)
            event = self._usage_event(ctx, plan, usage, status, fallback=fallback, stream=False)
            await self._settle(ctx, admission, served_tokens or _wasted(ctx), event)
            if outcome is not None:  # a failure is recorded with its status where it is answered
                self.record(ctx, "200", stream=False, outcome=outcome)

    async def stream(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> ServedStream:
        """Opens the stream (failing over until a first chunk arrives), so that errors before the
        first byte are ordinary HTTP errors. The stream is one generator of this module's, already
        started: closing it (the front door does, however the response ended) runs its own
        `finally`, which releases the upstream, the lease and the ticket and settles the quota."""
        items = self._streamed(ctx, endpoint, request, body)
        try:
            await anext(items)  # opened: the first chunk is in (or this raises why not)
        except BaseException:
            await run_shielded(items.aclose, what="release a stream that failed to open")
            raise
        return ServedStream(ctx, items)

    async def _streamed(
        self, ctx: CallContext, endpoint: Endpoint, request: ParsedRequest, body: dict[str, Any]
    ) -> AsyncGenerator[Streamed | None, None]:
        """Yields None once opened, then the client's items; everything it took is released in
        its `finally`, in the reverse order it was taken."""
        safety = self._begin_safety(ctx)
        body = safety.screen_input(endpoint, body)
        plan, ticket = await self._admit_load(ctx, self._plan(ctx, endpoint, request, body))
        try:
            admission = await self._admit_quota(ctx, plan.estimated_tokens, ticket)
        except BaseException:
            safety.finish()
            raise
        relay: StreamRelay | None = None
        try:
            async with LeaseKeeper(self._quota, admission):
                try:
                    opened = await safety.while_checking_input(
                        self._open(ctx, plan, self._route(ctx, plan, ctx.observed), ctx.observed)
                    )
                    try:
                        await safety.input_verdict()  # no byte reaches the client before the input passed
                    except BaseException:
                        await self._close(ctx, opened, "close a stream whose input was blocked")
                        raise
                    ticket.started()  # the first chunk is here: the prompt has left the node's queue
                    if plan.cascade is not None:
                        plan, opened = await self._cascade(ctx, plan, opened)
                    relay = StreamRelay(opened, plan, ctx.latency)
                except UpstreamsExhausted as exc:
                    self._refused_by_upstreams(ctx, exc)
                    raise
                try:
                    route = self._fleet.route_label(opened.target)
                    ctx.served_by(
                        opened.target,
                        opened.attempts,
                        plan.route_prefix,
                        route,
                        opened_usage=relay.opened_usage,
                    )
                    ctx.headers["server-timing"] = ctx.latency.at_first_byte().server_timing()
                    ctx.observed.first_chunk(opened.target.model, time.monotonic() - ctx.started)
                    yield None
                    items = safety.guard_stream(endpoint, self._relay(ctx, plan, relay))
                    try:
                        async for item in items:
                            if ctx.observed.wants_text and isinstance(item, Chunk):
                                ctx.observed.answered_text(chunk_text(item))
                            yield item
                    finally:
                        await items.aclose()
                finally:
                    await self._close(ctx, relay, "close the upstream stream")
        finally:
            ticket.release()
            await run_shielded(
                lambda: self._settle_stream(ctx, plan, admission, relay), what="settle a stream"
            )
            safety.finish()

    async def count_tokens(
        self, ctx: CallContext, request: ChatCompletionRequest, body: dict[str, Any]
    ) -> int:
        """The conversation's input tokens, counted by an upstream of the model a generation of
        it would be planned for (a node's tokenizer and chat template, or a provider's count
        API), after the tenant's input rules (what they redact is not counted, what they block
        is refused). Policy, residency and failover are a generation's; it counts as a request
        against the tenant's quota but reserves no tokens, waits in no admission queue, writes
        no usage event and marks no prefill on any node."""
        assert ctx.tenant is not None, "authenticate() before counting"
        safety = self._begin_safety(ctx)
        try:
            body = safety.screen_input("chat", body)
            plan = plan_request(
                "chat",
                request,
                body,
                ctx.tenant,
                self._catalog,
                self._config.token_estimate,
                self._auto,
                caps=False,
            )
            ctx.plans(plan.model.name)
            ctx.observed.planned("count_tokens", request, body.get("messages"), degraded=False)
            admission = await self._admit_quota(ctx, 0)  # one request, no tokens
            try:
                targets = self._route(ctx, plan, ctx.observed, generating=False)
                target, count, attempts = await self._failover.count_tokens(
                    targets, plan.body(stream=False), self._node_headers(ctx), ctx.observed
                )
            finally:
                await self._settle(ctx, admission, 0, None)
        finally:
            safety.finish()
        ctx.served_by(target, attempts, plan.route_prefix, self._fleet.route_label(target))
        self.record(ctx, "200", stream=False)
        return count

    # -- stages ---------------------------------------------------------------------------------

    def start_call(self, headers: Mapping[str, str]) -> CallContext:
        # Time-ordered (ms since the epoch, then 80 random bits, like UUIDv7): the ledger's primary
        # key index then grows at its end; random ids put each insert on a random page, which cost
        # more as the table grew (20 to 35 µs per event over 100k rows, against 12 flat).
        request_id = f"req_{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"
        return CallContext(
            request_id=request_id,
            client_region=headers.get("x-meridian-client-region") or None,
            session_key=headers.get(SESSION_HEADER, ""),
            observed=self._observer.start(headers, request_id),
        )

    def authenticate(self, ctx: CallContext, authorization: str | None) -> TenantPolicy:
        started = time.time_ns()
        scheme, _, key = (authorization or "").partition(" ")
        tenant = self._policies.current().authenticate(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            error = AuthenticationError(
                "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'."
            )
            ctx.observed.authenticated(None, started, time.time_ns(), error)
            raise error
        ctx.tenant = tenant
        ctx.api_key_id = api_key_id(key.strip())
        ctx.observed.authenticated(tenant, started, time.time_ns(), None)
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
            ctx.observed.auto_routed(tenant.tenant_id, plan.auto.tier, plan.auto.rule)
            plan = self._with_cascade(plan.noted(f"auto:{plan.auto.tier}", plan.auto.reason), tenant)
        ctx.plans(plan.model.name)
        prompt = body.get("messages") if endpoint == "chat" else body.get("prompt")
        ctx.observed.planned(_OPERATIONS.get(endpoint, endpoint), request, prompt, degraded=False)
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
        with ctx.observed.stage("escalation") as scope:
            plan, opened = await self._judged(ctx, plan, opened, scope)
            scope.note(escalated=ctx.escalation is not None, verdict=plan.route_prefix)
        return plan, opened

    async def _judged(
        self, ctx: CallContext, plan: RequestPlan, opened: OpenedStream, scope: Stage
    ) -> tuple[RequestPlan, OpenedStream]:
        assert ctx.tenant is not None and plan.cascade is not None and plan.escalate_to is not None
        tenant, family, large = ctx.tenant.tenant_id, plan.model.name, plan.escalate_to
        try:
            found = await probe(opened, plan.cascade.k_tokens)
        except BaseException:
            await self._close(ctx, opened, "close the small tier's stream")
            raise
        if not found.judgeable:
            # A break is continued by the relay as usual; an upstream without logprobs keeps it.
            unjudged = "unjudged=upstream_broke" if found.error is not None else "unjudged=no_logprobs"
            return plan.noted(unjudged), release(opened, found)
        verdict = judge(found.logprobs, plan.cascade)
        self.escalations.record(tenant, family, escalated=verdict.escalate)
        observed = ctx.observed
        observed.escalation_judged(tenant, family, self.escalations.history(tenant, family).rate)
        if not verdict.escalate:
            return plan.noted(verdict.reason), release(opened, found)
        escalated = dataclasses.replace(
            plan,
            model=large,
            cascade=None,
            escalate_to=None,
            route_notes=("auto:small->large", verdict.reason),
        )
        try:
            served = await self._open_large(ctx, escalated, scope)
        except (Overloaded, NoRouteError, UpstreamsExhausted, UpstreamRejected) as exc:
            # The small model's answer is better than none.
            observed.escalated(tenant, family, "large_unavailable")
            failed = f"escalation_failed={type(exc).__name__}"
            return plan.noted(verdict.reason, failed), release(opened, found)
        except BaseException:
            await self._close(ctx, opened, "close the small tier's stream")
            raise
        await self._close(ctx, opened, "abort the small tier's request")
        ctx.escalation = Escalated(
            model=family,
            target=opened.target,
            prompt_tokens=plan.prompt_tokens_estimate,
            completion_tokens=found.tokens,
            reason=verdict.reason,
        )
        observed.escalated(tenant, family, "low_confidence", (plan.prompt_tokens_estimate, found.tokens))
        ctx.plans(large.name)
        return escalated, served

    async def _open_large(self, ctx: CallContext, plan: RequestPlan, scope: Stage) -> OpenedStream:
        """The escalated request's stream: admitted on the large pool (a degraded admission means
        the large tier is over its target: no escalation), routed with the tenant's residency."""
        assert ctx.tenant is not None
        admitted = await self.admission.admit(
            ctx.tenant, plan.model, plan.prompt_tokens_estimate, plan.conversation, plan.needs
        )
        try:
            if admitted.degraded_from is not None:
                raise Overloaded(
                    model=plan.model.name, tier=ctx.tenant.traffic_tier, reason="over_target", retry_after_s=1
                )
            opened = await self._open(ctx, plan, self._route(ctx, plan, scope), scope)
            admitted.ticket.started()  # _open returns with the first chunk
            return opened
        finally:
            admitted.ticket.release()

    async def _open(
        self,
        ctx: CallContext,
        plan: RequestPlan,
        targets: Sequence[Target],
        scope: Stage,
        body: dict[str, Any] | None = None,
        *,
        routed: Target | None = None,
    ) -> OpenedStream:
        """The stream of the first of `targets` to answer (`body`: the plan's stream body).
        `routed`: the route's first target, where `targets` are a selection of the route's."""
        since = time.monotonic()
        served: Target | None = None
        try:
            opened = await self._failover.open_stream(
                targets,
                plan.endpoint,
                body or plan.body(stream=True),
                self._node_headers(ctx),
                scope,
            )
            served = opened.target
            return opened
        finally:
            ctx.latency.waited_since(since)
            # The first chunk: nodes send none before the first token (the prompt is computed).
            self._fleet.answered(ctx.request_id, routed or targets[0], served, ended=False)

    async def _close(self, ctx: CallContext, stream: OpenedStream | StreamRelay, what: str) -> None:
        """Close an upstream stream (a node aborts the request and frees its KV blocks); the
        overlay stops counting it among the node's running sequences."""
        try:
            await run_shielded(stream.aclose, what=what)
        finally:
            self._fleet.ended(ctx.request_id, stream.target)

    async def _complete_once(
        self, ctx: CallContext, plan: RequestPlan, targets: tuple[Target, ...]
    ) -> tuple[Target, Completion, int]:
        since = time.monotonic()
        target: Target | None = None
        try:
            target, result, attempts = await self._failover.complete(
                targets,
                plan.endpoint,
                plan.body(stream=False),
                self._node_headers(ctx),
                ctx.observed,
            )
        finally:
            ctx.latency.waited_since(since)
            self._fleet.answered(ctx.request_id, targets[0], target, ended=True)
        timings, result.timings = result.timings, UNSET
        ctx.latency.answered(timing_from_wire(timings if isinstance(timings, dict) else None))
        return target, result, attempts

    async def _complete_by_stream(
        self, ctx: CallContext, plan: RequestPlan, targets: tuple[Target, ...]
    ) -> tuple[RequestPlan, Target, Completion, int]:
        """A non-streamed request the cascade judges: streamed from the small model so that an
        escalation aborts it after K tokens, not after the whole answer; collected into one
        response (a break mid-way continues elsewhere, as for a client's stream)."""
        plan, opened = await self._cascade(ctx, plan, await self._open(ctx, plan, targets, ctx.observed))
        relay = StreamRelay(opened, plan, ctx.latency)
        try:
            items = [item async for item in self._relay(ctx, plan, relay)]
        finally:
            await self._close(ctx, relay, "close a collected stream")
        if relay.stopped is not None:
            raise UpstreamsExhausted(
                plan.model.name, [(relay.target, UpstreamError(relay.stopped, status_code=502))]
            )
        result = collect(plan.endpoint, [item for item in items if isinstance(item, Chunk)], relay.usage)
        return plan, opened.target, result, opened.attempts

    async def _admit_load(self, ctx: CallContext, plan: RequestPlan) -> tuple[RequestPlan, Ticket]:
        """Admission against the tier's target (may wait in the gateway queue; raises Overloaded).
        A degraded request is planned for the small tier from here on, continuations included."""
        assert ctx.tenant is not None
        with ctx.observed.stage("admission"):
            admitted = await self.admission.admit(
                ctx.tenant, plan.model, plan.prompt_tokens_estimate, plan.conversation, plan.needs
            )
        if admitted.degraded_from is not None:
            plan = dataclasses.replace(plan, model=admitted.model, degraded_from=admitted.degraded_from)
            ctx.plans(plan.model.name)
            ctx.observed.note(degraded=True)
        return plan, admitted.ticket

    async def _admit_quota(
        self, ctx: CallContext, estimated_tokens: int, ticket: Ticket | None = None
    ) -> Admission:
        """One request and `estimated_tokens` reserved; a failure releases the admission `ticket`."""
        assert ctx.tenant is not None
        try:
            with ctx.observed.stage("quota.admit"):
                admission = await self._quota.admit(
                    ctx.tenant, request_id=ctx.request_id, estimated_tokens=estimated_tokens
                )
        except BaseException:
            if ticket is not None:
                ticket.release()
            raise
        ctx.observed.quota_admitted(ctx.tenant.tenant_id, admission.store_state.source)
        ctx.headers.update(admission.headers)
        return admission

    def _route(
        self,
        ctx: CallContext,
        plan: RequestPlan,
        scope: Stage,
        exclude: frozenset[str] = frozenset(),
        *,
        version: str | None = None,
        generating: bool = True,
    ) -> tuple[Target, ...]:
        """`version`: only targets serving that version of the model (a continuation's pin).
        `generating`: False for a token count, which computes no prompt on the target."""
        with scope.stage("route") as stage:
            targets = self._decide_route(ctx, plan, exclude, version, generating)
            stage.note(targets=[t.target_id for t in targets], reason=targets[0].reason)
        return targets

    def _decide_route(
        self,
        ctx: CallContext,
        plan: RequestPlan,
        exclude: frozenset[str],
        version: str | None,
        generating: bool,
    ) -> tuple[Target, ...]:
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
            conversation=plan.conversation,
            prompt_tokens=plan.prompt_tokens_estimate,
            needs=plan.needs,
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
            if decision.unsupported:
                raise _unsupported(plan, decision.unsupported, decision.unavailable_reason)
            raise NoRouteError(model, decision.unavailable_reason or decision.reason)
        if (
            generating and decision.prefill is not None
        ):  # the overlay routing reads until the node's report shows it
            self._fleet.routed(decision.targets[0], decision.prefill, ctx.request_id)
        return decision.targets

    async def _relay(
        self, ctx: CallContext, plan: RequestPlan, relay: StreamRelay
    ) -> AsyncGenerator[Streamed, None]:
        """The client's chunks: relayed from one upstream after another until the stream ends.
        The relay reports a break; the continuation rule decides; a continuation is routed here."""
        failed: set[str] = set()
        while True:
            async for chunk in relay.chunks():
                yield chunk
            report = relay.broken
            if report is None:
                return
            self._fleet.ended(ctx.request_id, report.target)  # the relay closed it
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
                    ctx.observed.continued()
                    relay.resume(opened, step)
                    continue
            if step.ending == "error":
                relay.stop(step.why)
                yield StreamFailed(message=step.why)
            return

    async def _continue(
        self, ctx: CallContext, plan: RequestPlan, step: Continue, *, exclude: frozenset[str], version: str
    ) -> OpenedStream:
        """A continuation: routed afresh (fresh health, same residency, the upstreams this stream
        broke on excluded), to upstreams of the same model and the same `version` (the stream's;
        "": unversioned) that can take a token-exact continuation. NoRouteError says why there is
        none."""
        model = plan.model.name
        with ctx.observed.stage(
            "continuation", carried_tokens=step.carried, excluded=sorted(exclude)
        ) as scope:
            routed = self._route(ctx, plan, scope, exclude, version=version)
            targets = [
                t
                for t in routed
                if t.model == model and t.version == version and self._fleet.upstream_for(t).token_exact
            ]
            if not targets:
                self._fleet.answered(ctx.request_id, routed[0], None, ended=True)
                raise NoRouteError(
                    model, f"the upstreams left for '{model}' cannot continue a stream token-exactly"
                )
            return await self._open(ctx, plan, targets, scope, step.body(plan), routed=routed[0])

    async def _settle(
        self, ctx: CallContext, admission: Admission, served_tokens: int, event: bytes | None
    ) -> None:
        async def settle() -> None:
            with ctx.observed.stage("quota.settle"):
                await self._quota.settle(admission, actual_tokens=served_tokens, event=event)

        await run_shielded(settle, what="quota settle")

    async def _settle_stream(
        self, ctx: CallContext, plan: RequestPlan, admission: Admission, relay: StreamRelay | None
    ) -> None:
        """Runs as the stream's generator ends (shielded)."""
        ctx.latency.finish()  # the stream is over: its usage event has the whole breakdown
        if relay is None:  # failed before the first chunk: nothing was served
            event = self._usage_event(ctx, plan, None, "failed", stream=True)
            with ctx.observed.stage("quota.settle"):
                await self._quota.settle(admission, actual_tokens=_wasted(ctx), event=event)
            return
        usage = relay.usage
        served = (
            usage.total_tokens if usage else 0
        ) or plan.prompt_tokens_estimate + relay.completion_tokens()
        served += _wasted(ctx)
        status = "stream_error" if relay.stopped else "ok" if relay.finished else "incomplete"
        event = self._usage_event(
            ctx,
            plan,
            relay.usage,
            status,
            fallback=(plan.prompt_tokens_estimate, relay.completion_tokens()),
            stream=True,
            continuations=relay.continuations,
        )
        with ctx.observed.stage("quota.settle"):
            await self._quota.settle(admission, actual_tokens=served, event=event)
        outcome = Outcome(
            usage=usage,
            finish_reasons=(relay.finish_reason,) if relay.finish_reason else (),
            continuations=relay.continuations,
            stream_error=relay.stopped,
        )
        self.record(ctx, "stream_error" if relay.stopped else "200", stream=True, outcome=outcome)

    def _usage_event(
        self,
        ctx: CallContext,
        plan: RequestPlan,
        usage: Usage | None,
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
            route_prefix=plan.route_prefix,
            degraded=plan.degraded_from is not None,
            usage=msgspec.to_builtins(usage) if usage is not None else None,
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
            ctx.observed.priced(each.tenant_id, each.model, each.cost_usd)
        return encode_events(events)

    # -- what the front doors read -------------------------------------------------------------

    def allowed_models(self, tenant: TenantPolicy) -> list[CatalogModel]:
        return [model for model in self._catalog if tenant.allows_model(model.name)]

    async def usage(self, tenant: TenantPolicy) -> dict[str, Any]:
        return await self._quota.usage(tenant)

    def record(self, ctx: CallContext, status: str, *, stream: bool, outcome: Outcome = NO_OUTCOME) -> None:
        """The call ended (answered, failed, or its stream closed): its observers are told, once,
        and a non-streamed answer gets its Server-Timing header. `outcome`: how it ended, from the
        stage that ended it (a failure answered at the edge has none)."""
        if ctx.recorded:
            return
        ctx.recorded = True
        latency, served = ctx.latency, ctx.served
        latency.finish()
        if not stream:
            ctx.headers["server-timing"] = latency.timing().server_timing()
        ctx.observed.ended(
            Ended(
                status=status,
                stream=stream,
                tenant=ctx.tenant.tenant_id if ctx.tenant else "-",
                model=ctx.model,
                region=served.target.region if served is not None else "-",
                route=ctx.headers.get("x-meridian-route"),
                stream_error=outcome.stream_error,
                total_s=latency.total_s,
                gateway_s=latency.gateway_s,
                usage=outcome.usage,
                finish_reasons=outcome.finish_reasons,
                attempts=served.attempts if served is not None else 0,
                continuations=outcome.continuations,
                decisions=ctx.safety.decisions if ctx.safety is not None else (),
            )
        )

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


def _unsupported(plan: RequestPlan, capabilities: Sequence[str], why: str | None) -> InvalidRequestError:
    """A 400 naming the field that asks for what no upstream the tenant may use serves: no retry
    will ever be served; the client has to ask without it (or the operator to allow a provider)."""
    capability = next(c for c in plan.asks if c in capabilities)
    param = plan.asks[capability]
    return InvalidRequestError(
        f"{DESCRIBED[capability]} (asked by `{param}`) is not supported for model "
        f"'{plan.model.name}' by any upstream this tenant may use: {why}.",
        param=param,
    )


def _wasted(ctx: CallContext) -> int:
    """Tokens an escalated request used on the small tier: charged with the large tier's."""
    escalated = ctx.escalation
    return 0 if escalated is None else escalated.prompt_tokens + escalated.completion_tokens

"""A call's usage event (gateway/ledger's UsageEvent), built from what the request path knows when
it settles: here, in the call package, so the ledger never reaches back up into the call.

Pure: the pipeline hands in the call context, the usage the client received and the time; the
price table prices it. The usage is the client-facing one (after a continuation's carried tokens
moved from prompt to completion), so the ledger adds up to exactly what clients were told.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gateway.call.context import CallContext
from gateway.escalation.cascade import Escalated
from gateway.ledger.event import UsageEvent
from gateway.ledger.prices import PriceTable


def usage_counts(usage: Mapping[str, Any]) -> tuple[int, int, int]:
    """(prompt, cached prompt, completion) from an OpenAI usage object; cached <= prompt."""
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    return prompt, min(cached, prompt), int(usage.get("completion_tokens") or 0)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def usage_event(
    ctx: CallContext,
    *,
    model_requested: str,
    route_prefix: str,
    degraded: bool,
    usage: Mapping[str, Any] | None,
    fallback_counts: tuple[int, int] = (0, 0),
    status: str,
    stream: bool,
    continuations: int,
    prices: PriceTable,
    now_s: float,
) -> UsageEvent:
    """`usage` None: no upstream usage reached the gateway; `fallback_counts` (prompt, completion)
    are the gateway's own counts then, and the event says they are estimated. `route_prefix`: the
    plan's notes (RequestPlan.route_prefix), before the router's reason."""
    assert ctx.tenant is not None
    if usage is not None:
        prompt, cached, completion = usage_counts(usage)
    else:
        prompt, completion = fallback_counts
        cached = 0
    served = ctx.served
    target = served.target if served is not None else None
    upstream = target.target_id if target is not None else "-"
    served_model = target.model if target is not None else "-"
    price = prices.price(served_model if target is not None else model_requested, upstream)
    latency = ctx.latency  # gateway/call/latency.py: the one breakdown
    return UsageEvent(
        request_id=ctx.request_id,
        ts_ms=int(now_s * 1000),
        tenant_id=ctx.tenant.tenant_id,
        api_key_id=ctx.api_key_id,
        model_requested=model_requested,
        model=served_model,
        tier=ctx.tenant.traffic_tier,
        region=target.region if target is not None else "-",
        jurisdiction=target.jurisdiction if target is not None else "-",
        upstream=upstream,
        route_reason=route_prefix + target.reason if target is not None else "-",
        status=status,
        stream=stream,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        usage_estimated=usage is None and (prompt > 0 or completion > 0),
        cost_usd=price.cost_usd(prompt, cached, completion),
        price_version=prices.version,
        total_ms=_ms(latency.total_s) or 0.0,
        gateway_overhead_ms=_ms(latency.gateway_s),
        ttft_ms=_ms(latency.ttft_s),
        queue_wait_ms=_ms(latency.queue_s),
        prefill_ms=_ms(latency.prefill_s),
        decode_ms=_ms(latency.decode_s),
        retries=served.retries if served is not None else 0,
        continuations=continuations,
        degraded=degraded,
        safety=ctx.safety is not None and ctx.safety.changed,
        model_version=target.version if target is not None else "",
    )


# The small tier's event of an escalated request: its request id is the call's with this suffix.
ESCALATED_SUFFIX = ":small"


def escalated_event(served: UsageEvent, escalated: Escalated, prices: PriceTable) -> UsageEvent:
    """What an escalated `auto` request used on the small tier before the cascade aborted it, as
    its own event beside the large tier's `served` one (same tenant, key, time): each tier's
    tokens and cost count on its own model. Its prompt tokens are the gateway's estimate (the
    aborted stream reports no usage); its completion tokens are exact."""
    target = escalated.target
    prompt, completion = escalated.prompt_tokens, escalated.completion_tokens
    return msgspec.structs.replace(
        served,
        request_id=served.request_id + ESCALATED_SUFFIX,
        model=escalated.model,
        region=target.region,
        jurisdiction=target.jurisdiction,
        upstream=target.target_id,
        route_reason=f"auto:small->large;{escalated.reason}",
        model_version=target.version,
        status="escalated",
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        usage_estimated=True,
        cost_usd=prices.price(escalated.model, target.target_id).cost_usd(prompt, 0, completion),
        gateway_overhead_ms=None,
        ttft_ms=None,
        queue_wait_ms=None,
        prefill_ms=None,
        decode_ms=None,
        retries=0,
        continuations=0,
        degraded=False,
        safety=False,
    )

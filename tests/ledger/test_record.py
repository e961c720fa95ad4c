"""The usage event takes its latency split from the call's one breakdown (CallContext.latency) and
its safety flag from the call's content checks."""

from __future__ import annotations

import pytest

from gateway.call.context import CallContext
from gateway.call.usage import usage_event
from gateway.ledger.prices import ModelPrice, PriceTable
from gateway.safety.guard import CallSafety, Decision
from protocol.timing import Timing
from router.types import Target, TenantPolicy

PRICES = PriceTable("v1", {"m": ModelPrice(input=1.0, output=2.0)}, {})


def served_call(version: str = "") -> CallContext:
    ctx = CallContext(request_id="req_1", client_region=None)
    ctx.tenant = TenantPolicy(tenant_id="acme", api_key_hashes=frozenset())
    target = Target(
        kind="node",
        target_id="eu-1",
        url="http://eu-1",
        region="eu-west",
        jurisdiction="eu",
        model="m",
        reason="home",
        version=version,
    )
    ctx.served_by(target, attempts=2, prefix="")
    ctx.latency.started = 100.0
    ctx.latency.upstream_s = 0.25
    ctx.latency.first_byte = 100.1
    ctx.latency.answered(Timing(queue=0.01, prefill=0.04, decode=0.2))
    ctx.latency.ended = 100.3
    return ctx


def event_of(ctx: CallContext):  # type: ignore[no-untyped-def]
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    return usage_event(
        ctx,
        model_requested="m",
        route_prefix="",
        degraded=False,
        usage=usage,
        status="ok",
        stream=False,
        continuations=0,
        prices=PRICES,
        now_s=1_800_000_000.0,
    )


def test_the_latency_split_is_the_calls_breakdown() -> None:
    event = event_of(served_call())
    assert event.total_ms == pytest.approx(300.0)
    assert event.gateway_overhead_ms == pytest.approx(50.0)  # total minus the upstream wait
    assert event.ttft_ms == pytest.approx(100.0)
    assert (event.queue_wait_ms, event.prefill_ms, event.decode_ms) == pytest.approx((10.0, 40.0, 200.0))
    assert event.cost_usd == pytest.approx((10 * 1.0 + 5 * 2.0) / 1e6)
    assert (event.upstream, event.region, event.retries) == ("eu-1", "eu-west", 1)


def test_node_parts_are_unknown_when_no_upstream_reported_them() -> None:
    ctx = served_call()
    ctx.latency.upstreams.clear()
    event = event_of(ctx)
    assert (event.queue_wait_ms, event.prefill_ms, event.decode_ms) == (None, None, None)


def test_the_safety_flag_says_whether_a_check_redacted_or_blocked() -> None:
    ctx = served_call()
    assert event_of(ctx).safety is False
    ctx.safety = CallSafety(guard=None, request_id="req_1", tenant="acme", policy=None)  # type: ignore[arg-type]
    ctx.safety.decisions.append(Decision("input", "rules", "email", "flag"))
    assert event_of(ctx).safety is False  # flagged only: the request went through unchanged
    ctx.safety.decisions.append(Decision("output", "rules", "email", "redact"))
    assert event_of(ctx).safety is True


def test_the_event_records_the_version_that_served() -> None:
    assert event_of(served_call()).model_version == ""
    assert event_of(served_call(version="v2")).model_version == "v2"

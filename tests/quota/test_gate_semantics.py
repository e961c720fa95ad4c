"""What a tenant sees, identical over the in-process store and Redis (the `gate` fixture)."""

from __future__ import annotations

import pytest

from gateway.errors import to_api_error
from gateway.quota import QuotaExceeded, RequestTooLarge, StoreQuotaGate
from tests.quota.conftest import FakeClock, make_policy


async def test_admitted_request_carries_openai_rate_limit_headers(gate: StoreQuotaGate) -> None:
    policy = make_policy(requests_per_minute=10, tokens_per_minute=1000)
    admission = await gate.admit(policy, request_id="r1", estimated_tokens=300)
    assert admission.headers == {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "1m1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "700",
        "x-ratelimit-reset-tokens": "1m1s",
    }
    assert admission.reserved_tokens == 300


async def test_tokens_over_limit_get_429_with_retry_after(gate: StoreQuotaGate, clock: FakeClock) -> None:
    policy = make_policy(tokens_per_minute=1000)
    await gate.admit(policy, request_id="a", estimated_tokens=600)
    clock.advance(10_000)
    await gate.admit(policy, request_id="b", estimated_tokens=300)
    with pytest.raises(QuotaExceeded) as caught:
        await gate.admit(policy, request_id="c", estimated_tokens=200)
    error = to_api_error(caught.value)
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    # 100 tokens short: the first 600 must leave the window, 61 s after they were charged.
    assert error.headers["retry-after"] == "51"
    assert error.headers["x-ratelimit-remaining-tokens"] == "100"
    assert "tokens per minute" in error.message


async def test_requests_per_minute_limit_is_exact(gate: StoreQuotaGate, clock: FakeClock) -> None:
    policy = make_policy(requests_per_minute=3)
    for i in range(3):
        await gate.admit(policy, request_id=f"r{i}", estimated_tokens=1)
        clock.advance(20_000)
    with pytest.raises(QuotaExceeded) as caught:  # 60 s after the first, which counts until 61 s
        await gate.admit(policy, request_id="r3", estimated_tokens=1)
    assert to_api_error(caught.value).headers["retry-after-ms"] == "1000"
    clock.advance(1_000)
    await gate.admit(policy, request_id="r4", estimated_tokens=1)


async def test_window_slides_rather_than_resetting_at_a_boundary(
    gate: StoreQuotaGate, clock: FakeClock
) -> None:
    policy = make_policy(requests_per_minute=2)
    clock.advance(59_500)  # late in a wall-clock minute: a fixed window would reset in 0.5 s
    await gate.admit(policy, request_id="a", estimated_tokens=1)
    await gate.admit(policy, request_id="b", estimated_tokens=1)
    clock.advance(1_000)
    with pytest.raises(QuotaExceeded):
        await gate.admit(policy, request_id="c", estimated_tokens=1)
    clock.advance(60_000)
    await gate.admit(policy, request_id="d", estimated_tokens=1)


async def test_settlement_refunds_unused_tokens(gate: StoreQuotaGate) -> None:
    policy = make_policy(tokens_per_minute=1000)
    admission = await gate.admit(policy, request_id="a", estimated_tokens=800)
    assert (await gate.usage(policy))["tokens"]["remaining"] == 200
    await gate.settle(admission, actual_tokens=150)
    assert (await gate.usage(policy))["tokens"]["remaining"] == 850
    await gate.admit(policy, request_id="b", estimated_tokens=800)  # fits only after the refund


async def test_settling_twice_refunds_once(gate: StoreQuotaGate) -> None:
    policy = make_policy(tokens_per_minute=1000)
    first = await gate.admit(policy, request_id="a", estimated_tokens=500)
    await gate.admit(policy, request_id="b", estimated_tokens=500)
    await gate.settle(first, actual_tokens=100)
    await gate.settle(first, actual_tokens=100)
    assert (await gate.usage(policy))["tokens"]["used"] == 600


async def test_overrun_beyond_the_estimate_is_charged(gate: StoreQuotaGate) -> None:
    policy = make_policy(tokens_per_minute=1000, daily_tokens=10_000)
    admission = await gate.admit(policy, request_id="a", estimated_tokens=100)
    await gate.settle(admission, actual_tokens=250)
    usage = await gate.usage(policy)
    assert usage["tokens"]["used"] == 250
    assert usage["daily_tokens"]["used"] == 250


async def test_concurrency_cap_and_release_on_settle(gate: StoreQuotaGate) -> None:
    policy = make_policy(concurrent_requests=2)
    first = await gate.admit(policy, request_id="a", estimated_tokens=1)
    await gate.admit(policy, request_id="b", estimated_tokens=1)
    with pytest.raises(QuotaExceeded) as caught:
        await gate.admit(policy, request_id="c", estimated_tokens=1)
    assert "concurrent requests" in caught.value.message
    assert to_api_error(caught.value).headers["retry-after"] == "1"
    await gate.settle(first, actual_tokens=1)
    await gate.admit(policy, request_id="d", estimated_tokens=1)


async def test_unsettled_lease_expires(gate: StoreQuotaGate, clock: FakeClock) -> None:
    policy = make_policy(concurrent_requests=1)
    await gate.admit(policy, request_id="a", estimated_tokens=1)  # never settled: its owner died
    clock.advance(1_999)
    with pytest.raises(QuotaExceeded):
        await gate.admit(policy, request_id="b", estimated_tokens=1)
    clock.advance(1)
    await gate.admit(policy, request_id="c", estimated_tokens=1)


async def test_renewed_lease_outlives_its_first_expiry(gate: StoreQuotaGate, clock: FakeClock) -> None:
    policy = make_policy(concurrent_requests=1)
    admission = await gate.admit(policy, request_id="a", estimated_tokens=1)
    clock.advance(1_500)
    await gate.renew(admission)
    clock.advance(1_500)
    with pytest.raises(QuotaExceeded):
        await gate.admit(policy, request_id="b", estimated_tokens=1)
    assert (await gate.usage(policy))["concurrent_requests"]["in_use"] == 1


async def test_no_lease_without_a_concurrency_cap(gate: StoreQuotaGate) -> None:
    admission = await gate.admit(make_policy(requests_per_minute=5), request_id="a", estimated_tokens=1)
    assert admission.lease_id is None


async def test_daily_budget_runs_out_until_midnight(gate: StoreQuotaGate, clock: FakeClock) -> None:
    policy = make_policy(daily_tokens=1000)
    await gate.admit(policy, request_id="a", estimated_tokens=900)
    with pytest.raises(QuotaExceeded) as caught:
        await gate.admit(policy, request_id="b", estimated_tokens=200)
    assert to_api_error(caught.value).headers["retry-after"] == str(12 * 3600)  # the clock starts at noon UTC
    clock.advance(12 * 3600 * 1000)
    await gate.admit(policy, request_id="c", estimated_tokens=200)


@pytest.mark.parametrize("limit", ["tokens_per_minute", "daily_tokens"])
async def test_estimate_above_a_token_limit_is_a_clear_400(gate: StoreQuotaGate, limit: str) -> None:
    policy = make_policy(**{limit: 500})
    with pytest.raises(RequestTooLarge) as caught:
        await gate.admit(policy, request_id="a", estimated_tokens=501)
    error = to_api_error(caught.value)
    assert error.status_code == 400
    assert error.code == "request_too_large" and error.param == "max_tokens"
    assert "can never be admitted" in error.message


async def test_refused_request_reserves_nothing(gate: StoreQuotaGate) -> None:
    policy = make_policy(requests_per_minute=10, tokens_per_minute=100, concurrent_requests=5)
    await gate.admit(policy, request_id="a", estimated_tokens=90)
    with pytest.raises(QuotaExceeded):
        await gate.admit(policy, request_id="b", estimated_tokens=20)
    usage = await gate.usage(policy)
    assert (usage["requests"]["used"], usage["tokens"]["used"], usage["concurrent_requests"]["in_use"]) == (
        1,
        90,
        1,
    )


async def test_usage_reports_use_and_remaining(gate: StoreQuotaGate) -> None:
    policy = make_policy(
        requests_per_minute=10, tokens_per_minute=1000, concurrent_requests=3, daily_tokens=5000
    )
    await gate.admit(policy, request_id="a", estimated_tokens=400)
    usage = await gate.usage(policy)
    assert usage["tenant"] == policy.tenant_id and usage["window_seconds"] == 60
    assert usage["requests"] == {"limit": 10, "used": 1, "remaining": 9, "reset": "1m1s"}
    assert usage["tokens"] == {"limit": 1000, "used": 400, "remaining": 600, "reset": "1m1s"}
    assert usage["concurrent_requests"] == {"limit": 3, "in_use": 1, "remaining": 2}
    assert usage["daily_tokens"]["used"] == 400 and usage["daily_tokens"]["remaining"] == 4600


async def test_unlimited_tenant_is_admitted_without_headers(gate: StoreQuotaGate) -> None:
    admission = await gate.admit(make_policy(), request_id="a", estimated_tokens=10**6)
    assert admission.headers == {}

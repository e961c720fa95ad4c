"""A target that refuses for load (429, or a node's 503 `overloaded` with Retry-After) is busy,
not broken: no failure verdict for its breaker, and failover ends with the soonest Retry-After."""

from __future__ import annotations

from gateway.call.errors import NoRouteError
from gateway.errors import to_api_error
from gateway.health.breaker import Outcome
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.errors import UpstreamsExhausted
from gateway.upstreams.failover import verdict
from gateway.upstreams.node import status_error
from router.types import Target

OVERLOADED = (
    b'{"error": {"message": "queue full", "type": "server_error", "param": null, "code": "overloaded"}}'
)


def _target(node_id: str) -> Target:
    return Target(
        kind="node",
        target_id=node_id,
        url=f"http://{node_id}",
        region="eu-west",
        jurisdiction="eu",
        model="m",
        reason="test",
    )


def test_a_node_503_with_retry_after_is_at_capacity_and_gets_no_failure_verdict() -> None:
    overloaded = status_error(503, "7", OVERLOADED, "n1")
    assert overloaded.at_capacity and overloaded.retry_after == 7.0
    assert verdict(overloaded) == (Outcome.NEUTRAL, None)
    broken = status_error(503, None, b'{"error": {"message": "aborted", "code": "request_aborted"}}', "n1")
    assert not broken.at_capacity and verdict(broken)[0] is Outcome.FAILURE
    assert verdict(UpstreamError("down", status_code=502))[0] is Outcome.FAILURE


def test_every_target_overloaded_ends_in_429_with_the_soonest_retry_after() -> None:
    failures = [
        (_target("n1"), status_error(503, "9", OVERLOADED, "n1")),
        (_target("n2"), status_error(503, "4", OVERLOADED, "n2")),
    ]
    exhausted = UpstreamsExhausted("m", failures)
    assert exhausted.all_at_capacity() and exhausted.retry_after_s() == 4.0
    error = to_api_error(exhausted)
    assert error.status_code == 429 and error.headers["retry-after"] == "4"
    mixed = UpstreamsExhausted("m", [*failures, (_target("n3"), UpstreamError("down", status_code=502))])
    assert not mixed.all_at_capacity() and to_api_error(mixed).status_code == 503


def test_no_route_is_a_503_that_says_when_to_come_back() -> None:
    # Every node of the residency briefly out (ejected, or a missed probe): the spike drill's
    # clients must be told to retry, like every other refusal.
    error = to_api_error(NoRouteError("m", "no healthy node serving 'm' in jurisdictions eu"))
    assert (error.status_code, error.code, error.headers) == (
        503,
        "no_region_available",
        {"retry-after": "1"},
    )

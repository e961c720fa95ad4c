"""Commercial providers: last, and only when the policy allows them, healthy and in residency."""

from __future__ import annotations

from router import RouteRequest, route
from tests.router.builders import LARGE, fleet, node, provider, tenant

REQUEST = RouteRequest(LARGE, home_region="eu-west")


def test_providers_come_after_every_node() -> None:
    fleet_ = fleet(
        node("busy", kv=0.99), node("far", "us-west"), providers=(provider("openai-eu", "eu-west"),)
    )

    decision = route(REQUEST, tenant(allow_commercial=True), fleet_)

    assert [t.target_id for t in decision.targets] == ["far", "busy", "openai-eu"]
    last = decision.targets[-1]
    assert last.kind == "provider" and last.reason == "provider=openai;region=eu-west;same-region"


def test_no_providers_without_allow_commercial() -> None:
    fleet_ = fleet(providers=(provider("openai-eu", "eu-west"),))

    decision = route(REQUEST, tenant(allow_commercial=False), fleet_)

    assert decision.targets == ()
    assert decision.unavailable_reason == (
        "no node in the fleet serves 'meridian-large'; commercial fallback is disabled for this tenant"
    )


def test_providers_outside_residency_are_not_used() -> None:
    fleet_ = fleet(providers=(provider("openai-us", "us-east"), provider("anthropic-eu", "eu-west")))

    decision = route(REQUEST, tenant(jurisdictions=("eu",), allow_commercial=True), fleet_)

    assert [t.target_id for t in decision.targets] == ["anthropic-eu"]


def test_unhealthy_providers_are_not_used() -> None:
    fleet_ = fleet(providers=(provider("openai-eu", "eu-west", healthy=False),))

    decision = route(REQUEST, tenant(allow_commercial=True), fleet_)

    assert decision.targets == ()
    assert "1 provider was unhealthy" in (decision.unavailable_reason or "")


def test_providers_are_ordered_by_preference_class() -> None:
    fleet_ = fleet(
        providers=(provider("a-us", "us-east"), provider("b-eu", "eu-central"), provider("c-eu", "eu-west"))
    )

    decision = route(REQUEST, tenant(allow_commercial=True), fleet_)

    assert [t.target_id for t in decision.targets] == ["c-eu", "b-eu", "a-us"]


def test_providers_that_do_not_serve_the_model_are_not_used() -> None:
    fleet_ = fleet(providers=(provider("openai", "eu-west", models=("gpt-4o",)),))

    assert route(REQUEST, tenant(allow_commercial=True), fleet_).targets == ()

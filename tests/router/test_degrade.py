"""Degrade: small-tier nodes take a large model's overflow, only when the policy says so."""

from __future__ import annotations

from router import FleetSnapshot, RouteRequest, degrade_model, route
from tests.router.builders import CATALOG, LARGE, SMALL, fleet, node, tenant

DEGRADING = tenant(allow_degrade=True)
STRICT = tenant(allow_degrade=False)
REQUEST = RouteRequest(LARGE, home_region="eu-west")


def saturated_large_fleet() -> FleetSnapshot:
    return fleet(
        node("large-1", kv=0.99),
        node("large-2", kv=0.5, waiting=50_000),
        node("small-1", models=(SMALL,), kv=0.2),
    )


def test_saturated_large_tier_overflows_to_small_when_allowed() -> None:
    decision = route(REQUEST, DEGRADING, saturated_large_fleet(), catalog=CATALOG)

    assert [(t.target_id, t.model) for t in decision.targets] == [
        ("large-1", LARGE),
        ("large-2", LARGE),
        ("small-1", SMALL),
    ]
    assert decision.targets[-1].reason.startswith("degraded;")
    assert "1 degraded to meridian-small" in decision.reason


def test_no_degrade_when_the_policy_does_not_allow_it() -> None:
    decision = route(REQUEST, STRICT, saturated_large_fleet(), catalog=CATALOG)

    assert {t.model for t in decision.targets} == {LARGE}


def test_no_degrade_while_a_large_node_has_capacity() -> None:
    fleet_ = fleet(node("large-1", kv=0.99), node("large-2", kv=0.3), node("small-1", models=(SMALL,)))

    decision = route(REQUEST, DEGRADING, fleet_, catalog=CATALOG)

    assert [t.target_id for t in decision.targets] == ["large-2", "large-1"]


def test_unknown_load_counts_as_capacity() -> None:
    fleet_ = fleet(node("large-1"), node("small-1", models=(SMALL,)))

    decision = route(REQUEST, DEGRADING, fleet_, catalog=CATALOG)

    assert [t.target_id for t in decision.targets] == ["large-1"]


def test_every_large_node_down_degrades_to_small() -> None:
    fleet_ = fleet(node("large-1", healthy=False), node("small-1", models=(SMALL,)))

    decision = route(REQUEST, DEGRADING, fleet_, catalog=CATALOG)

    assert [(t.target_id, t.model) for t in decision.targets] == [("small-1", SMALL)]


def test_degrade_stays_inside_residency() -> None:
    fleet_ = fleet(node("large-eu", "eu-west", healthy=False), node("small-us", "us-east", models=(SMALL,)))
    policy = tenant(jurisdictions=("eu",), allow_degrade=True)

    decision = route(REQUEST, policy, fleet_, catalog=CATALOG)

    assert decision.targets == ()


def test_a_node_serving_both_tiers_is_not_listed_twice() -> None:
    fleet_ = fleet(node("both", models=(LARGE, SMALL), kv=0.99), node("small-1", models=(SMALL,)))

    decision = route(REQUEST, DEGRADING, fleet_, catalog=CATALOG)

    assert [t.target_id for t in decision.targets] == ["both", "small-1"]


def test_small_requests_never_degrade() -> None:
    assert degrade_model(SMALL, DEGRADING, CATALOG) is None


def test_degrade_needs_a_small_model_the_tenant_may_use() -> None:
    assert degrade_model(LARGE, tenant(allow_degrade=True, models=(LARGE,)), CATALOG) is None
    assert degrade_model(LARGE, DEGRADING, CATALOG) == CATALOG[0]


def test_without_a_catalog_route_does_not_degrade() -> None:
    decision = route(REQUEST, DEGRADING, saturated_large_fleet())

    assert {t.model for t in decision.targets} == {LARGE}

"""The order of nodes: (saturated, preference class, load band, affinity rank, node id)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router import RouteDecision, RouteRequest, RoutingParams, rendezvous_rank, route
from tests.router.builders import ANYWHERE, LARGE, fleet, node, tenant


def order(decision: RouteDecision) -> list[str]:
    return [t.target_id for t in decision.targets]


def test_same_region_comes_first_then_same_jurisdiction_then_others() -> None:
    fleet_ = fleet(node("us", "us-east"), node("central", "eu-central"), node("west", "eu-west"))

    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(decision) == ["west", "central", "us"]
    assert [t.reason.split(";")[1] for t in decision.targets] == [
        "same-region",
        "same-jurisdiction",
        "other-region",
    ]


def test_client_region_overrides_home_region() -> None:
    fleet_ = fleet(node("west", "eu-west"), node("us", "us-east"))

    decision = route(RouteRequest(LARGE, home_region="eu-west", client_region="us-east"), ANYWHERE, fleet_)

    assert order(decision) == ["us", "west"]


@given(client_region=st.sampled_from(["mars-1", "", "EU-WEST", "eu-west ", "us-east\x00"]))
def test_a_client_region_the_fleet_has_nothing_in_leaves_the_home_region_preferred(
    client_region: str,
) -> None:
    """An unknown region in x-meridian-client-region must not undo the home-region preference
    (every node would be "other-region", ordered by load alone, the far one first here)."""
    fleet_ = fleet(
        node("far", "us-east", kv=0.0), node("central", "eu-central", kv=0.3), node("home", "eu-west", kv=0.6)
    )

    unknown = route(RouteRequest(LARGE, home_region="eu-west", client_region=client_region), ANYWHERE, fleet_)
    without = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(unknown) == order(without) == ["home", "central", "far"]
    assert unknown.targets[0].reason.split(";")[1] == "same-region"


def test_preferred_jurisdiction_is_learned_from_unhealthy_nodes_too() -> None:
    # The only eu-west node is down, but it still tells us eu-west is in the EU.
    fleet_ = fleet(
        node("west", "eu-west", healthy=False),
        node("us", "us-east", kv=0.0),
        node("central", "eu-central", kv=0.9),
    )

    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(decision) == ["central", "us"]


def test_less_loaded_node_comes_first_within_a_region() -> None:
    fleet_ = fleet(node("busy", kv=0.8), node("idle", kv=0.05))

    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(decision) == ["idle", "busy"]


def test_waiting_tokens_count_as_load() -> None:
    fleet_ = fleet(node("queued", kv=0.1, waiting=16_384), node("clear", kv=0.3))

    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(decision) == ["clear", "queued"]


def test_region_outranks_load() -> None:
    fleet_ = fleet(node("local-busy", "eu-west", kv=0.9), node("remote-idle", "us-east", kv=0.0))

    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(decision) == ["local-busy", "remote-idle"]


def test_saturated_node_sinks_below_every_unsaturated_node() -> None:
    fleet_ = fleet(
        node("local-full", "eu-west", kv=0.97),
        node("local-queue", "eu-west", kv=0.1, waiting=40_000),
        node("remote", "us-east", kv=0.5),
    )

    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(decision)[0] == "remote"
    assert all("saturated" in t.reason for t in decision.targets[1:])


def test_unknown_load_is_neutral() -> None:
    fleet_ = fleet(node("busy", kv=0.9), node("unknown"), node("idle", kv=0.0))

    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet_)

    assert order(decision) == ["idle", "unknown", "busy"]
    assert "load=unknown" in decision.targets[1].reason


def test_affinity_breaks_ties_among_similar_load() -> None:
    ids = [f"node-{i}" for i in range(6)]
    fleet_ = fleet(*(node(i, kv=0.10 + 0.01 * n) for n, i in enumerate(ids)))

    decision = route(
        RouteRequest(LARGE, home_region="eu-west", affinity_key="You are a helpful bot."), ANYWHERE, fleet_
    )

    assert order(decision) == list(rendezvous_rank("You are a helpful bot.", ids))
    assert decision.targets[0].reason.endswith("affinity=1/6")


def test_affinity_does_not_override_a_load_difference() -> None:
    key = "system prompt"
    preferred, other = rendezvous_rank(key, ["a", "b"])
    fleet_ = fleet(node(preferred, kv=0.7), node(other, kv=0.1))

    decision = route(RouteRequest(LARGE, home_region="eu-west", affinity_key=key), ANYWHERE, fleet_)

    assert order(decision) == [other, preferred]
    assert "affinity" not in decision.targets[0].reason


def test_affinity_does_not_override_region() -> None:
    key = "system prompt"
    preferred, other = rendezvous_rank(key, ["a", "b"])
    fleet_ = fleet(node(preferred, "us-east"), node(other, "eu-west"))

    decision = route(RouteRequest(LARGE, home_region="eu-west", affinity_key=key), ANYWHERE, fleet_)

    assert order(decision) == [other, preferred]


def test_same_affinity_key_always_picks_the_same_first_node() -> None:
    fleet_ = fleet(*(node(f"n{i}") for i in range(8)))
    request = RouteRequest(LARGE, home_region="eu-west", affinity_key="<|system|>You are terse.")

    firsts = {route(request, ANYWHERE, fleet_).targets[0].target_id for _ in range(5)}

    assert len(firsts) == 1


@given(
    key=st.text(max_size=20),
    loads=st.lists(st.floats(0.0, 0.19), min_size=2, max_size=8),
    data=st.data(),
)
def test_removing_another_node_of_similar_load_keeps_the_first_target(
    key: str, loads: list[float], data: st.DataObject
) -> None:
    nodes = [node(f"n{i}", kv=kv) for i, kv in enumerate(loads)]
    request = RouteRequest(LARGE, home_region="eu-west", affinity_key=key)
    first = route(request, ANYWHERE, fleet(*nodes)).targets[0].target_id
    removed = data.draw(st.sampled_from([n for n in nodes if n.node_id != first]))

    rest = fleet(*(n for n in nodes if n is not removed))

    assert route(request, ANYWHERE, rest).targets[0].target_id == first


def test_different_affinity_keys_spread_over_nodes() -> None:
    fleet_ = fleet(*(node(f"n{i}") for i in range(4)))

    firsts = {
        route(RouteRequest(LARGE, home_region="eu-west", affinity_key=f"prompt {k}"), ANYWHERE, fleet_)
        .targets[0]
        .target_id
        for k in range(64)
    }

    assert firsts == {"n0", "n1", "n2", "n3"}


def test_isolated_tenants_get_their_own_affinity_space() -> None:
    fleet_ = fleet(*(node(f"n{i}") for i in range(8)))
    firsts = set()
    for t in range(16):
        policy = tenant(tenant_id=f"tenant-{t}", prefix_cache="isolated")
        request = RouteRequest(LARGE, home_region="eu-west", affinity_key="the same system prompt")
        firsts.add(route(request, policy, fleet_).targets[0].target_id)

    # Shared-cache tenants would all land on one node; isolated ones cannot share it, so spread.
    assert len(firsts) > 1


def test_load_band_width_is_a_parameter() -> None:
    key = "k"
    preferred, other = rendezvous_rank(key, ["a", "b"])
    fleet_ = fleet(node(preferred, kv=0.5), node(other, kv=0.1))
    request = RouteRequest(LARGE, home_region="eu-west", affinity_key=key)

    wide = route(request, ANYWHERE, fleet_, params=RoutingParams(load_band_width=1.0))

    assert order(wide) == [preferred, other]


def test_target_reason_names_region_load_and_cost_parts() -> None:
    decision = route(RouteRequest(LARGE, home_region="eu-west"), ANYWHERE, fleet(node("w", kv=0.123)))

    assert decision.targets[0].reason == "region=eu-west;same-region;load=0.12;cost=0.000;cached=0;wait=0.000"
    assert decision.reason == "model=meridian-large; residency=anywhere; preferred=eu-west; 1 node"

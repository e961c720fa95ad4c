"""Versioned models: the version a sticky key draws, and routing only to nodes of that version."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from router import (
    FleetSnapshot,
    ModelVersion,
    NodeLoad,
    Rollout,
    RouteRequest,
    checkpoint_drift,
    choose_version,
    route,
)
from tests.router.builders import LARGE, fleet, node, provider, tenant

CANARY = Rollout((("v1", 10), ("v2", 90)))
ROLLED_BACK = Rollout((("v1", 0), ("v2", 100)))


def _versioned(node_id: str, version: str, checkpoint: str = "", *, in_load: bool = False):
    served = {LARGE: ModelVersion(version, checkpoint)}
    base = node(node_id)
    if in_load:
        return dataclasses.replace(base, load=NodeLoad(versions=served))
    return dataclasses.replace(base, versions=served)


def _request(key: str = "", **kwargs) -> RouteRequest:
    return RouteRequest(model=LARGE, home_region="eu-west", session_key=key, **kwargs)


def test_a_thousand_keys_split_ten_ninety_within_four_sigma() -> None:
    n, p = 1000, 0.10
    on_v1 = sum(choose_version(CANARY, f"user-{i}") == "v1" for i in range(n))
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(on_v1 - n * p) <= 4 * sigma, on_v1


@given(st.text(max_size=40))
def test_a_key_keeps_its_version_while_the_weights_are_unchanged(key: str) -> None:
    first = choose_version(CANARY, key)
    assert all(choose_version(Rollout(CANARY.weights), key) == first for _ in range(3))


@given(st.text(max_size=40))
def test_rolling_back_to_zero_moves_every_key_at_once(key: str) -> None:
    assert choose_version(ROLLED_BACK, key) == "v2"
    assert choose_version(Rollout((("v1", 100), ("v2", 0))), key) == "v1"


@given(st.text(max_size=40), st.integers(1, 99), st.integers(1, 99))
def test_growing_the_canary_only_moves_keys_onto_it(key: str, small: int, grow: int) -> None:
    before = choose_version(Rollout((("v2", small), ("v1", 100 - small))), key)
    larger = min(100, small + grow)
    after = choose_version(Rollout((("v2", larger), ("v1", 100 - larger))), key)
    assert before != "v2" or after == "v2"


def test_routing_goes_only_to_nodes_of_the_drawn_version() -> None:
    snapshot = fleet(_versioned("a", "v1"), _versioned("b", "v2", in_load=True), node("unknown"))
    for i in range(200):
        key = f"s{i}"
        decision = route(_request(key), tenant(), snapshot, rollouts={LARGE: CANARY})
        drawn = choose_version(CANARY, key)
        assert decision.version == drawn
        assert [t.target_id for t in decision.targets] == (["a"] if drawn == "v1" else ["b"])
        assert decision.targets[0].version == drawn


def test_the_affinity_key_is_the_sticky_key_without_a_session() -> None:
    snapshot = fleet(_versioned("a", "v1"), _versioned("b", "v2"))
    request = RouteRequest(model=LARGE, home_region="eu-west", affinity_key="You are a helpful bot")
    decision = route(request, tenant(), snapshot, rollouts={LARGE: CANARY})
    assert decision.version == choose_version(CANARY, "You are a helpful bot")


def test_no_node_of_the_drawn_version_says_so_and_does_not_fall_back() -> None:
    snapshot = fleet(_versioned("b", "v2"), providers=(provider("openai"),))
    only_v1 = Rollout((("v1", 1), ("v2", 0)))
    policy = dataclasses.replace(tenant(), allow_commercial=True)
    decision = route(_request("k"), policy, snapshot, rollouts={LARGE: only_v1})
    assert decision.targets == ()
    assert decision.unavailable_reason is not None
    assert "version 'v1' of 'meridian-large'" in decision.unavailable_reason


def test_a_pinned_version_wins_over_the_rollout() -> None:
    snapshot = fleet(_versioned("a", "v1"), _versioned("b", "v2"))
    decision = route(_request("k", version="v1"), tenant(), snapshot, rollouts={LARGE: ROLLED_BACK})
    assert [t.target_id for t in decision.targets] == ["a"]


def test_without_a_rollout_every_version_serves_and_targets_name_theirs() -> None:
    snapshot = FleetSnapshot(nodes=(_versioned("a", "v1"), _versioned("b", "v2"), node("c")))
    decision = route(_request("k"), tenant(), snapshot)
    assert decision.version is None
    assert {t.target_id: t.version for t in decision.targets} == {"a": "v1", "b": "v2", "c": ""}


def test_the_load_report_wins_over_the_directory() -> None:
    stated = _versioned("a", "v1")
    reported = dataclasses.replace(stated, load=NodeLoad(versions={LARGE: ModelVersion("v2")}))
    decision = route(_request("k", version="v2"), tenant(), fleet(reported))
    assert [t.target_id for t in decision.targets] == ["a"]


def test_drift_is_replicas_of_one_version_with_different_checkpoints() -> None:
    nodes = (
        _versioned("a", "v1", "aaa"),
        _versioned("b", "v1", "bbb", in_load=True),
        _versioned("c", "v2", "ccc"),
        _versioned("d", "v2", "ccc"),
        _versioned("e", "v2"),
    )
    assert checkpoint_drift(nodes) == {(LARGE, "v1"): frozenset({"aaa", "bbb"})}

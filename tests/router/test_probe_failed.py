"""Nodes failing their golden probes for a model (NodeLoad.probe_failed) get none of that model's
traffic, keep the traffic of their other models, and the decision says why (issue 34)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router import NodeInfo, NodeLoad, RouteRequest, route
from tests.router.builders import CATALOG, LARGE, SMALL, fleet, tenant

REGIONS = ("eu-west", "eu-central", "us-east")


def probed(node_id: str, region: str, failing: frozenset[str], healthy: bool = True) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        url=f"http://{node_id}:9000",
        region=region,
        jurisdiction="eu" if region.startswith("eu") else "us",
        models=frozenset({SMALL, LARGE}),
        healthy=healthy,
        load=NodeLoad(probe_failed=failing),
    )


def test_only_the_failing_model_is_routed_around_and_the_header_says_so() -> None:
    snapshot = fleet(probed("home", "eu-west", frozenset({LARGE})), probed("away", "eu-central", frozenset()))
    large = route(RouteRequest(model=LARGE, home_region="eu-west"), tenant(), snapshot, catalog=CATALOG)
    assert [t.target_id for t in large.targets] == ["away"]
    assert large.targets[0].reason.startswith("probe-failed=home;")
    small = route(RouteRequest(model=SMALL, home_region="eu-west"), tenant(), snapshot, catalog=CATALOG)
    assert [t.target_id for t in small.targets] == ["home", "away"]
    assert "probe-failed" not in small.targets[0].reason


def test_no_node_left_names_the_probe_failure() -> None:
    # Its only model failing, the node is not ready either: the probe is still what is named.
    snapshot = fleet(probed("home", "eu-west", frozenset({LARGE}), healthy=False))
    decision = route(RouteRequest(model=LARGE, home_region="eu-west"), tenant(), snapshot, catalog=CATALOG)
    assert not decision.targets
    assert "failing golden-output probes for it (home)" in (decision.unavailable_reason or "")


@given(
    st.lists(
        st.tuples(st.sampled_from(REGIONS), st.sets(st.sampled_from((SMALL, LARGE))), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from((SMALL, LARGE)),
    st.sampled_from(REGIONS),
)
def test_a_model_never_goes_to_a_node_failing_its_probe(
    nodes: list[tuple[str, set[str], bool]], model: str, home: str
) -> None:
    snapshot = fleet(
        *(
            probed(f"n{i}", region, frozenset(failing), healthy)
            for i, (region, failing, healthy) in enumerate(nodes)
        )
    )
    decision = route(RouteRequest(model=model, home_region=home), tenant(), snapshot, catalog=CATALOG)
    failing = {f"n{i}" for i, (_, models, _) in enumerate(nodes) if model in models}
    assert not {t.target_id for t in decision.targets if t.model == model} & failing
    servable = {f"n{i}" for i, (_, models, healthy) in enumerate(nodes) if healthy and model not in models}
    assert {t.target_id for t in decision.targets if t.model == model} == servable

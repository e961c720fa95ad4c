"""Rollout configuration: validated at load, reloaded from the config file, and checkpoint drift."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.call.rollouts import RolloutPlans
from gateway.config import ConfigError, load_config
from gateway.discovery.static import load_regions
from protocol.consul.advertisement import MetaError, ModelVersionTag, decode_versions, node_from_entry
from protocol.consul.wire import AgentService, ServiceEntry
from regional_node.discovery import ConsulRegistrationConfig, build_registration
from regional_node.server.checkpoint import checkpoint_hash
from router import FleetSnapshot, ModelVersion, NodeInfo, NodeLoad, Rollout

CONFIG = """
home_region: eu-west
policies: policies
catalog:
  - name: meridian-small
    tier: small
    versions: [v1, v2]
    rollout: {versions: {v2: 10, v1: 90}}
  - {name: meridian-large, tier: large}
directory: {type: static, file: regions.yaml}
"""


def write(tmp_path: Path, text: str, name: str = "gateway.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_rollout_loads_in_its_listed_order(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CONFIG))
    assert config.rollouts() == {"meridian-small": Rollout((("v2", 10), ("v1", 90)))}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("{v2: 10, v1: 90}", "{v3: 10, v1: 90}"), "['v3'] not in the model's versions"),
        (("{v2: 10, v1: 90}", "{v2: 0, v1: 0}"), "the weights must sum to more than 0"),
        (("{v2: 10, v1: 90}", "{v2: -1, v1: 90}"), ">= 0"),
        (("{v2: 10, v1: 90}", "{}"), "at least one version"),
    ],
)
def test_a_bad_rollout_stops_loading_and_names_the_field(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, CONFIG.replace(*change)))
    assert "$.catalog[0].rollout.versions" in str(info.value) and message in str(info.value)


def _plans(tmp_path: Path, snapshot: FleetSnapshot = FleetSnapshot()) -> tuple[RolloutPlans, Path]:
    path = write(tmp_path, CONFIG)
    return RolloutPlans(load_config(path), lambda: snapshot, CollectorRegistry()), path


def test_a_reload_takes_the_new_weights(tmp_path: Path) -> None:
    plans, path = _plans(tmp_path)
    path.write_text(CONFIG.replace("{v2: 10, v1: 90}", "{v2: 0, v1: 100}"), encoding="utf-8")
    assert plans.reload()
    assert plans.current()["meridian-small"] == Rollout((("v2", 0), ("v1", 100)))


def test_a_broken_reload_keeps_the_last_good_plans(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plans, path = _plans(tmp_path)
    before = plans.current()
    for broken in (
        CONFIG.replace("{v2: 10, v1: 90}", "{v9: 10}"),  # invalid
        CONFIG.replace("meridian-large", "meridian-huge"),  # the catalog changed: a restart
    ):
        path.write_text(broken, encoding="utf-8")
        with caplog.at_level(logging.ERROR):
            assert not plans.reload()
        assert plans.current() == before
    assert "rollout reload rejected" in caplog.text


def test_other_changes_are_logged_as_needing_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plans, path = _plans(tmp_path)
    path.write_text(CONFIG.replace("home_region: eu-west", "home_region: us-east"), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert not plans.reload()
    assert "only the rollouts take effect before a restart" in caplog.text


def _replica(node_id: str, checkpoint: str) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        url="http://x",
        region="eu-west",
        jurisdiction="eu",
        models=frozenset({"meridian-small"}),
        load=NodeLoad(versions={"meridian-small": ModelVersion("v1", checkpoint)}),
    )


def test_drift_sets_the_gauge_and_warns_once_then_clears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = [FleetSnapshot(nodes=(_replica("a", "aaa"), _replica("b", "bbb")))]
    path = write(tmp_path, CONFIG)
    registry = CollectorRegistry()
    plans = RolloutPlans(load_config(path), lambda: fleet[0], registry)
    labels = {"model": "meridian-small", "version": "v1"}
    with caplog.at_level(logging.WARNING):
        plans.check_drift()
        plans.check_drift()
    assert registry.get_sample_value("meridian_gateway_version_drift", labels) == 2
    assert caplog.text.count("checkpoint drift") == 1
    fleet[0] = FleetSnapshot(nodes=(_replica("a", "aaa"), dataclasses.replace(_replica("b", "aaa"))))
    plans.check_drift()
    assert registry.get_sample_value("meridian_gateway_version_drift", labels) is None


def test_the_regions_file_may_state_versions(tmp_path: Path) -> None:
    regions = """
nodes:
  - {node_id: n1, url: "http://127.0.0.1:9001", region: eu-west, jurisdiction: eu,
     models: [meridian-small], versions: {meridian-small: v2}}
"""
    (node,) = load_regions(write(tmp_path, regions, "regions.yaml"))
    assert node.versions == {"meridian-small": ModelVersion("v2")}
    with pytest.raises(ConfigError, match=r"versions: not in its models: \['other'\]"):
        load_regions(write(tmp_path, regions.replace("{meridian-small: v2}", "{other: v2}"), "regions.yaml"))


def test_consul_meta_carries_versions_and_reads_back() -> None:
    registration = build_registration(
        ConsulRegistrationConfig(),
        node_id="n1",
        region="eu-west",
        jurisdiction="eu",
        host="127.0.0.1",
        port=9001,
        models=[("meridian-small", "small"), ("meridian-large", "large")],
        versions=[ModelVersionTag("meridian-small", "v2", "00ff00ff00ff00ff")],
    )
    assert registration.Meta["versions"] == "meridian-small=v2@00ff00ff00ff00ff"
    service = AgentService(
        ID=registration.ID, Address=registration.Address, Port=registration.Port, Meta=registration.Meta
    )
    advert = node_from_entry(ServiceEntry(Service=service))
    assert advert.versions == (ModelVersionTag("meridian-small", "v2", "00ff00ff00ff00ff"),)
    assert decode_versions("") == ()
    with pytest.raises(MetaError):
        decode_versions("meridian-small")


def test_the_checkpoint_hash_follows_the_config_and_the_weight_files(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 64}', encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    first = checkpoint_hash.__wrapped__(str(folder))
    assert len(first) == 16 and first == checkpoint_hash.__wrapped__(str(folder))
    (folder / "model.safetensors").write_bytes(b"x" * 11)
    assert checkpoint_hash.__wrapped__(str(folder)) != first
    assert checkpoint_hash.__wrapped__(str(tmp_path / "absent")) == ""

"""Gateway and regions configuration: valid files load; invalid ones name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config
from gateway.discovery.static import StaticDirectory, load_regions

VALID = """
home_region: eu-west
policies: policies
catalog:
  - {name: meridian-small, tier: small}
  - {name: meridian-large, tier: large}
directory: {type: static, file: regions.yaml}
quota: {}
timeouts: {connect_s: 1.5}
"""

REGIONS = """
nodes:
  - node_id: eu-west-1
    url: http://127.0.0.1:9001/
    region: eu-west
    jurisdiction: eu
    models: [meridian-small]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_config_loads_with_defaults_and_paths_relative_to_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "gateway.yaml", VALID))
    assert config.timeouts.connect_s == 1.5
    assert config.timeouts.stream_idle_s == 30.0
    assert config.listen.port == 8080
    assert config.policies == str(tmp_path / "policies")
    assert config.directory["file"] == str(tmp_path / "regions.yaml")
    assert [m.tier for m in config.catalog_models()] == ["small", "large"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("timeouts: {connect_s: 1.5}", "timeouts: {connect_s: fast}"), "$.timeouts.connect_s"),
        (("timeouts: {connect_s: 1.5}", "timeouts: {conect_s: 1}"), "$.timeouts"),
        (("tier: large", "tier: huge"), "$.catalog[1].tier"),
        (("home_region: eu-west\n", ""), "$.home_region"),
        (("type: static", "type: zookeeper"), "$.directory.type"),
        (("timeouts: {connect_s: 1.5}", "timeouts: {connect_s: 0}"), "$.timeouts.connect_s"),
        (("timeouts: {connect_s: 1.5}", "retry: {max_attempts: 11}"), "$.retry.max_attempts"),
        (("timeouts: {connect_s: 1.5}", "retry: {backoff_base_s: -1}"), "$.retry.backoff_base_s"),
        (("timeouts: {connect_s: 1.5}", "ejection: {base_s: 0}"), "$.ejection.base_s"),
        (("timeouts: {connect_s: 1.5}", "ejection: {base_s: 5, max_s: 1}"), "$.ejection.max_s"),
    ],
)
def test_invalid_config_names_file_and_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    path = write(tmp_path, "gateway.yaml", VALID.replace(*change))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert field in str(info.value)


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_regions_file_parses_nodes(tmp_path: Path) -> None:
    (node,) = load_regions(write(tmp_path, "regions.yaml", REGIONS))
    assert node.node_id == "eu-west-1" and node.url == "http://127.0.0.1:9001"
    assert node.jurisdiction == "eu" and node.models == frozenset({"meridian-small"})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("region: eu-west", "regoin: eu-west"), "regoin"),
        (("http://127.0.0.1:9001/", "127.0.0.1:9001"), "url"),
    ],
)
def test_invalid_regions_file_names_the_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    path = write(tmp_path, "regions.yaml", REGIONS.replace(*change))
    with pytest.raises(ConfigError) as info:
        load_regions(path)
    assert str(path) in str(info.value) and field in str(info.value)


async def test_static_directory_reloads_and_keeps_last_good_membership(tmp_path: Path) -> None:
    import asyncio
    import os

    path = write(tmp_path, "regions.yaml", REGIONS)
    directory = StaticDirectory(path, poll_interval_s=0.02)
    await directory.start()
    try:
        assert [n.node_id for n in directory.snapshot()] == ["eu-west-1"]
        path.write_text(REGIONS.replace("eu-west-1", "eu-west-9"), encoding="utf-8")
        os.utime(path, ns=(1, 10**18))
        for _ in range(100):
            if directory.snapshot()[0].node_id == "eu-west-9":
                break
            await asyncio.sleep(0.02)
        assert directory.snapshot()[0].node_id == "eu-west-9"
        path.write_text("nodes: [oops", encoding="utf-8")
        os.utime(path, ns=(1, 2 * 10**18))
        await asyncio.sleep(0.1)
        assert directory.snapshot()[0].node_id == "eu-west-9"
    finally:
        await directory.stop()

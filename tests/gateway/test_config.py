"""Gateway and regions configuration: valid files load; invalid ones name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, ConsulDirectoryConfig, StaticDirectoryConfig, load_config
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
    assert isinstance(config.directory, StaticDirectoryConfig)
    assert config.directory.file == str(tmp_path / "regions.yaml")
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


PROVIDER = """
providers:
  endpoints:
    - id: openai-us
      kind: openai
      base_url: https://api.openai.example/v1
      api_key_env: OPENAI_KEY_FOR_TEST
      region: us-east
      jurisdiction: US
      models: {meridian-small: gpt-4o-mini}
"""


@pytest.mark.parametrize(
    ("change", "field", "typo"),
    [
        (
            ("quota: {}", "quota: {redis_ulr: redis://127.0.0.1:6379/0}"),
            "$.quota.redis_ulr",
            "did you mean 'redis_url'",
        ),
        (("quota: {}", "quota: {timeout_ms: 0}"), "$.quota.timeout_ms", ">= 1"),
        (
            ("quota: {}", PROVIDER.replace("endpoints:", "endpoint:")),
            "$.providers.endpoint",
            "did you mean 'endpoints'",
        ),
        (
            ("quota: {}", PROVIDER.replace("region:", "regoin:")),
            "$.providers.endpoints[0].regoin",
            "did you mean 'region'",
        ),
        (
            ("quota: {}", PROVIDER.replace("kind: openai", "kind: gemini")),
            "$.providers.endpoints[0].kind",
            "gemini",
        ),
        (
            ("file: regions.yaml", "file: regions.yaml, poll_intervall_s: 1"),
            "$.directory.poll_intervall_s",
            "did you mean 'poll_interval_s'",
        ),
        (
            ("type: static, file: regions.yaml", "type: consul, datacentres: [eu]"),
            "$.directory.datacentres",
            "did you mean 'datacenters'",
        ),
        (("type: static, file: regions.yaml", "type: consul, wait_s: 900"), "$.directory.wait_s", "600"),
    ],
)
def test_a_mistake_in_quota_providers_or_directory_stops_loading_and_names_the_field(
    tmp_path: Path, change: tuple[str, str], field: str, typo: str
) -> None:
    """These sections are validated with the file, not later by the part that uses them."""
    path = write(tmp_path, "gateway.yaml", VALID.replace(*change))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {field}: ")
    assert typo in str(info.value)


def test_sections_load_into_their_structs(tmp_path: Path) -> None:
    text = VALID.replace(
        "quota: {}", "quota: {redis_url: redis://127.0.0.1:6379/0, timeout_ms: 150}\n" + PROVIDER
    )
    config = load_config(write(tmp_path, "gateway.yaml", text))
    assert (config.quota.redis_url, config.quota.timeout_ms, config.quota.lease_ms) == (
        "redis://127.0.0.1:6379/0",
        150,
        30_000,
    )
    (entry,) = config.providers.endpoints
    assert (entry.id, entry.kind, entry.models) == ("openai-us", "openai", {"meridian-small": "gpt-4o-mini"})
    assert entry.timeouts.idle_s == 30.0


def test_absent_or_null_quota_and_providers_mean_their_defaults(tmp_path: Path) -> None:
    for text in (VALID.replace("quota: {}\n", ""), VALID.replace("quota: {}", "quota:\nproviders:")):
        config = load_config(write(tmp_path, "gateway.yaml", text))
        assert config.quota.redis_url is None and config.providers.endpoints == []


def test_a_directory_without_a_type_is_static(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "gateway.yaml", VALID.replace("type: static, ", "")))
    assert isinstance(config.directory, StaticDirectoryConfig)
    assert config.directory.file == str(tmp_path / "regions.yaml")


def test_consul_directory_tls_files_resolve_against_the_config_folder(tmp_path: Path) -> None:
    consul = "type: consul, scheme: https, tls: {ca_file: certs/ca.pem, cert_file: /abs/cert.pem}"
    config = load_config(
        write(tmp_path, "gateway.yaml", VALID.replace("type: static, file: regions.yaml", consul))
    )
    assert isinstance(config.directory, ConsulDirectoryConfig)
    assert config.directory.tls.ca_file == str(tmp_path / "certs" / "ca.pem")
    assert config.directory.tls.cert_file == "/abs/cert.pem"


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

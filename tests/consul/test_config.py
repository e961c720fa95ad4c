"""The `consul:` config sections: validated at start-up, with errors that name the field."""

from __future__ import annotations

import ssl
from pathlib import Path

import msgspec
import pytest

from gateway.config import ConfigError, ConsulDirectoryConfig, DirectoryConfig
from gateway.discovery import ConsulRegionDirectory, StaticDirectory, build_region_directory
from protocol.consul.client import ConsulClient, ConsulConfig, ConsulTLS, _ssl_context
from regional_node.discovery import ConsulRegistrationConfig
from tests.support.gateway_config import gateway_config


def directory_config(section: dict, base_dir: Path | None = None) -> DirectoryConfig:
    return gateway_config(directory=section, source="directory", base_dir=base_dir).directory


def test_type_consul_builds_the_consul_directory() -> None:
    section = {"type": "consul", "address": "consul.internal:8500", "datacenters": ["eu-west", "us-east"]}
    directory = build_region_directory(directory_config(section, Path("/etc/meridian")))
    assert isinstance(directory, ConsulRegionDirectory)


def test_type_static_still_builds_the_static_directory(tmp_path: Path) -> None:
    directory = build_region_directory(directory_config({"type": "static", "file": "regions.yaml"}, tmp_path))
    assert isinstance(directory, StaticDirectory)


def test_an_unknown_directory_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="type"):
        directory_config({"type": "etcd"})


def test_a_typo_in_the_consul_section_names_the_field() -> None:
    with pytest.raises(ConfigError, match="datacentres"):
        directory_config({"type": "consul", "datacentres": ["eu"]})


def test_a_wait_beyond_consuls_ten_minute_cap_is_refused() -> None:
    with pytest.raises(ConfigError, match="wait_s"):
        directory_config({"type": "consul", "wait_s": 900})


def test_relative_tls_files_resolve_against_the_config_folder() -> None:
    config = directory_config(
        {"type": "consul", "scheme": "https", "tls": {"ca_file": "certs/ca.pem"}},
        base_dir=Path("/etc/meridian"),
    )
    assert isinstance(config, ConsulDirectoryConfig)
    assert config.tls.ca_file == "/etc/meridian/certs/ca.pem"
    assert config.base_url() == "https://127.0.0.1:8500"


def test_tls_verification_can_be_turned_off_only_explicitly() -> None:
    assert _ssl_context(ConsulTLS()) is True
    assert _ssl_context(ConsulTLS(verify=False)) is False


def test_a_missing_ca_file_fails_when_the_client_is_built(tmp_path: Path) -> None:
    with pytest.raises((OSError, ssl.SSLError)):
        ConsulClient(ConsulConfig(tls=ConsulTLS(ca_file=str(tmp_path / "missing.pem"))))


def test_an_address_with_a_scheme_wins_over_the_scheme_field() -> None:
    assert ConsulConfig(address="https://consul:8501", scheme="http").base_url() == "https://consul:8501"


def test_the_node_section_decodes_with_registration_settings() -> None:
    raw = {
        "address": "127.0.0.1:8500",
        "ttl_s": 6,
        "deregister_critical_after_s": 120,
        "advertise_address": "10.0.0.5",
    }
    config = msgspec.convert(raw, ConsulRegistrationConfig)
    assert (config.ttl_s, config.advertise_address, config.service) == (6.0, "10.0.0.5", "meridian-node")


def test_a_sub_second_ttl_is_a_config_error() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.ttl_s"):
        msgspec.convert({"ttl_s": 0.0005}, ConsulRegistrationConfig)

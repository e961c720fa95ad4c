"""deploy/: the compose file parses and its Meridian configs pass the real config validation.

No Docker engine runs here, so this is as far as the compose stack can be checked locally.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.config import config_from_dict
from gateway.discovery import ConsulRegionDirectory, build_region_directory
from regional_node.server.config import convert_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_compose_file_has_consul_redis_and_two_regions() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert {"consul", "redis", "node-eu", "node-us", "gateway-eu", "gateway-us"} <= set(services)
    assert services["consul"]["image"].startswith("hashicorp/consul")
    for name in ("node-eu", "node-us", "gateway-eu", "gateway-us"):
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        assert "consul" in services[name]["depends_on"]
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert (DEPLOY / source).exists(), f"{volume}: mounted file missing"


def test_node_configs_register_in_consul_with_their_region() -> None:
    for region, jurisdiction in (("eu", "eu"), ("us", "us")):
        path = DEPLOY / "config" / f"node-{region}.yaml"
        config = convert_config(yaml.safe_load(path.read_text(encoding="utf-8")), source=str(path))
        assert config.consul is not None
        assert config.consul.address == "consul:8500"
        assert config.consul.advertise_address == f"node-{region}"
        assert config.jurisdiction == jurisdiction


def test_gateway_configs_use_the_consul_directory() -> None:
    for region in ("eu", "us"):
        path = DEPLOY / "config" / f"gateway-{region}.yaml"
        config = config_from_dict(
            yaml.safe_load(path.read_text(encoding="utf-8")), source=str(path), base_dir=path.parent
        )
        directory = build_region_directory(config.directory)
        assert isinstance(directory, ConsulRegionDirectory)

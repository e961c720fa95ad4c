"""Choose the region directory a gateway config asks for: `type: static` or `type: consul`."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.config import DirectoryConfig, StaticDirectoryConfig
from gateway.discovery.consul import ConsulRegionDirectory
from gateway.discovery.interface import RegionDirectory
from gateway.discovery.static import StaticDirectory


def build_region_directory(
    config: DirectoryConfig, *, registry: CollectorRegistry | None = None
) -> RegionDirectory:
    """The directory for a config's `directory:` section (its paths already resolved by the
    config loader). `registry` receives the Consul directory's metrics (the static one has none)."""
    if isinstance(config, StaticDirectoryConfig):
        return StaticDirectory(Path(config.file), poll_interval_s=config.poll_interval_s)
    return ConsulRegionDirectory(config, registry=registry)

"""Choose the region directory a gateway config asks for: `type: static` or `type: consul`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.config import ConfigError
from gateway.discovery.consul import consul_directory
from gateway.discovery.interface import RegionDirectory
from gateway.discovery.static import StaticDirectory


def build_region_directory(
    section: dict[str, Any],
    base_dir: str | Path | None = None,
    *,
    registry: CollectorRegistry | None = None,
    source: str = "directory",
) -> RegionDirectory:
    """The directory for a config's `directory:` section; relative paths resolve against `base_dir`.

    `registry` receives the Consul directory's metrics (the static one has none).
    """
    base = Path(base_dir) if base_dir is not None else None
    kind = section.get("type", "static")
    if kind == "consul":
        return consul_directory(section, base_dir=base, registry=registry, source=source)
    if kind == "static":
        file = section.get("file")
        if not isinstance(file, str):
            raise ConfigError(f"{source}: file: a static directory needs a regions file")
        path = Path(file)
        if base is not None and not path.is_absolute():
            path = base / path
        return StaticDirectory(path, poll_interval_s=float(section.get("poll_interval_s", 2.0)))
    raise ConfigError(f"{source}: type: expected 'static' or 'consul', got {kind!r}")

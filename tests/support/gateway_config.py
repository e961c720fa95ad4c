"""A minimal valid gateway config plus the sections a test cares about, validated as a file is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig, config_from_dict

MINIMAL: dict[str, Any] = {
    "home_region": "eu-west",
    "policies": "policies",
    "catalog": [{"name": "meridian-small", "tier": "small"}],
    "directory": {"type": "static", "file": "regions.yaml"},
}


def gateway_config(
    *, source: str = "gateway.yaml", base_dir: Path | None = None, **sections: Any
) -> GatewayConfig:
    """ConfigError (naming `source` and the field) for a mistake in any section."""
    return config_from_dict({**MINIMAL, **sections}, source=source, base_dir=base_dir)

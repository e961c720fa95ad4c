"""A gateway config for quota tests: one stub node, tenants from the test, quota from the test."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

MODEL = "meridian-small"


def api_key(tenant_id: str) -> str:
    return f"sk-test-{tenant_id}"


def write_gateway_config(
    folder: Path, *, node_url: str, tenants: list[dict[str, Any]], quota: dict[str, Any] | None
) -> Path:
    """`tenants`: [{"id", "limits": {...}, "fail_mode"?}]; each gets the key `api_key(id)`."""
    policies = folder / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    entries = [
        {
            "id": t["id"],
            "api_keys": ["sha256:" + hashlib.sha256(api_key(t["id"]).encode()).hexdigest()],
            "limits": t["limits"],
            "fail_mode": t.get("fail_mode", "open"),
        }
        for t in tenants
    ]
    (policies / "tenants.yaml").write_text(yaml.safe_dump({"tenants": entries}))
    node = {
        "node_id": "stub-1",
        "url": node_url,
        "region": "us-east",
        "jurisdiction": "us",
        "models": [MODEL],
    }
    (folder / "regions.yaml").write_text(yaml.safe_dump({"nodes": [node]}))
    config: dict[str, Any] = {
        "home_region": "us-east",
        "catalog": [{"name": MODEL, "tier": "small"}],
        "policies": "policies",
        "directory": {"type": "static", "file": "regions.yaml"},
        "timeouts": {"probe_interval_s": 0.5},
        # Quota tests time four gateways on two cores; the ledger's workers are tested in tests/ledger.
        "ledger": {"enabled": False},
    }
    if quota is not None:
        config["quota"] = quota
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path

"""The gateway and the CLI's gateway commands run with the node's stack absent: torch, numpy,
tokenizers, safetensors and jinja2 are made unimportable (a meta-path finder that refuses them,
in a fresh interpreter) while every gateway entry point is imported and an app is built and asked
for its models, its OpenAPI document and a policy check. And `pip install meridian` does not ask for
them: they are the `node` extra."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.support.processes import REPO_ROOT

NODE_STACK = ("torch", "numpy", "tokenizers", "safetensors", "jinja2")

_PROBE = r"""
import importlib, sys
BLOCKED = set(sys.argv[1].split(","))

class RefuseNodeStack:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is the node's: a gateway path imported it")
        return None

sys.meta_path.insert(0, RefuseNodeStack())

# Every module the CLI imports for `gateway`, `policy`, `safety`, `ledger`, `usage`, `escalation`
# (meridian/cli.py), and the gateway's own packages.
for module in (
    "meridian.cli", "gateway.app", "gateway.config", "gateway.runtime.serve", "gateway.runtime.workers",
    "gateway.policy.__main__", "gateway.safety.__main__", "gateway.ledger.commands",
    "gateway.ledger.worker", "meridian.escalation.cli", "router", "protocol", "telemetry",
):
    importlib.import_module(module)

from pathlib import Path
from litestar.testing import TestClient
from gateway.app import create_app
from tests.support.gateway_config import gateway_config

# Its state (the ledger's default `.meridian/ledger.sqlite`) goes in the test's folder, not the repo.
directory = {"type": "static", "file": sys.argv[3]}
app = create_app(gateway_config(policies=sys.argv[2], directory=directory, base_dir=Path(sys.argv[3]).parent))
with TestClient(app) as client:
    assert client.get("/openapi.json").status_code == 200
    answer = client.get("/v1/models", headers={"authorization": "Bearer sk-meridian-us-example"})
    assert answer.status_code == 200, answer.text

from meridian.cli import main
assert main(["policy", "check", sys.argv[2]]) == 0
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print("gateway ran without", sorted(BLOCKED))
"""


def test_gateway_and_its_cli_commands_run_without_the_node_stack(tmp_path: Path) -> None:
    regions = tmp_path / "regions.yaml"
    regions.write_text("nodes: []\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(NODE_STACK), str(REPO_ROOT / "policies"), str(regions)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "gateway ran without" in result.stdout


def test_the_node_stack_is_the_node_extra_not_a_base_dependency() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = {Requirement(spec).name for spec in project["dependencies"]}
    node = {Requirement(spec).name for spec in project["optional-dependencies"]["node"]}
    assert base.isdisjoint(NODE_STACK), base & set(NODE_STACK)
    assert set(NODE_STACK) <= node

"""A model that goes wrong while its node runs (issue 34): the node's probe schedule catches it and
the gateway routes that model around the node, saying so in x-meridian-route, until a probe
passes again.

The fault is the test-only one (regional_node/probes/fault.py, absent from production images):
while a file named after the model exists in MERIDIAN_TEST_FAULT_DIR, the node's logits for it
come out shifted, so every greedy token changes and every health check stays green.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.gateway.conftest import (
    AUTH,
    GLOBAL_KEY,
    NodeProcess,
    gateway_config,
    run_gateway,
    start_nodes,
    write_regions,
)
from tests.support.processes import python_command

pytestmark = pytest.mark.slow

MODEL = "meridian-small"
HEADERS = {"authorization": f"Bearer {GLOBAL_KEY}"}
DEADLINE_S = 60.0


class ProbedNode(NodeProcess):
    """A node probing its model every 0.3 s (no share limit: the test waits on the schedule),
    with the test fault armed through `fault_dir`."""

    fault_dir: Path | None = None

    def command(self) -> list[str]:
        config = self.log_path.with_suffix(".yaml")
        models = [
            {"name": name, "path": str(path), "tier": tier, "probes": {"interval_s": 0.3, "max_share": 1.0}}
            for name, (path, tier) in self.models.items()
        ]
        config.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
        cmd = [part for part in super().command() if not part.startswith(("--model", f"{MODEL}="))]
        return [*cmd, "--config", str(config)]

    @property
    def extra_env(self) -> dict[str, str]:  # type: ignore[override]
        return {"MERIDIAN_TEST_FAULT_DIR": str(self.fault_dir)} if self.fault_dir else {}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProbedNode, ProbedNode, Path]]:
    from tests.support.checkpoints import make_checkpoint

    checkpoint = make_checkpoint(tmp_path_factory.mktemp("certified"), "llama", "tiny")
    done = subprocess.run(
        python_command("-m", "meridian.cli", "model", "certify", str(checkpoint)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    logs = tmp_path_factory.mktemp("node-logs")
    faults = tmp_path_factory.mktemp("faults")
    home = ProbedNode("home-1", "eu-west", "eu", {MODEL: (checkpoint, "small")}, logs)
    home.fault_dir = faults
    away = ProbedNode("away-1", "eu-north", "eu", {MODEL: (checkpoint, "small")}, logs)
    try:
        start_nodes([home, away])
        yield home, away, faults
    finally:
        home.stop()
        away.stop()


def _served_by(http: httpx.Client) -> tuple[str, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.headers["x-meridian-node"], response.headers["x-meridian-route"]


def _until(http: httpx.Client, node_id: str, says: str = "") -> str:
    """Send requests until one is served by `node_id` with `says` in its route header."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        served, route = _served_by(http)
        if served == node_id and says in route:
            return route
        assert time.monotonic() < deadline, f"still served by {served} ({route})"
        time.sleep(0.1)


def test_a_model_that_goes_wrong_is_routed_around_until_it_passes(
    fleet: tuple[ProbedNode, ProbedNode, Path], tmp_path: Path
) -> None:
    home, away, faults = fleet
    regions = write_regions(tmp_path / "regions.yaml", [home, away])
    with (
        run_gateway(gateway_config(regions)) as gateway,
        httpx.Client(base_url=gateway.url, headers=HEADERS, timeout=30) as http,
    ):
        assert "probe-failed" not in _until(http, "home-1")  # the home region first while it is sound

        (faults / MODEL).touch()  # the kernel goes wrong
        _until(http, "away-1", says="probe-failed=home-1")
        # Routed around, not failed over: the gateway no longer tries the home node at all.
        for _ in range(5):
            served, route = _served_by(http)
            assert served == "away-1" and route.startswith("probe-failed=home-1;"), route
            assert "after" not in route  # no failed attempt on the home node
        load = httpx.get(f"{home.url}/load", headers=AUTH, timeout=5).json()
        assert load["per_model"][MODEL]["probe"] == "failed"
        # The gateway's /health says which model it leaves alone where.
        assert httpx.get(f"{gateway.url}/health", timeout=5).json()["probe_failed"] == {"home-1": [MODEL]}
        # What the gateway sees, in its own metrics: the failing model, and the nodes' queue age.
        registry = gateway.gateway.metrics.registry
        labels = {"node_id": "home-1", "region": "eu-west", "model": MODEL}
        assert registry.get_sample_value("meridian_gateway_node_probe_failed", labels) == 1
        assert (
            registry.get_sample_value(
                "meridian_gateway_node_probe_failed", {**labels, "node_id": "away-1", "region": "eu-north"}
            )
            == 0
        )
        age = registry.get_sample_value(
            "meridian_gateway_node_queue_age_seconds", {**labels, "tier": "interactive"}
        )
        assert age is not None and age >= 0

        (faults / MODEL).unlink()  # mended: the next passing probe brings it back
        assert "probe-failed" not in _until(http, "home-1")
        deadline = time.monotonic() + DEADLINE_S
        while registry.get_sample_value("meridian_gateway_node_probe_failed", labels) != 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)

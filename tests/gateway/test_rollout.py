"""Versioned models end to end: real node processes serving one model name at two versions.

Nodes state `version:` in their config and report it (and their checkpoint's hash) in /load; the
gateway routes by the catalog's rollout plan, reloaded from its config file, and names the
version it served in `system_fingerprint`.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router import Rollout, choose_version
from tests.gateway.conftest import (
    GLOBAL_KEY,
    NodeProcess,
    RunningGateway,
    break_stream_midway,
    gateway_config,
    run_gateway,
    start_nodes,
    write_regions,
)

pytestmark = pytest.mark.slow

MODEL = "meridian-small"
TIMEOUT_S = 45.0
HEADERS = {"authorization": f"Bearer {GLOBAL_KEY}"}


class VersionedNode(NodeProcess):
    """A node whose config file says which version of each model it serves."""

    version = ""

    def command(self) -> list[str]:
        config = self.log_path.with_suffix(".yaml")
        models = [
            {"name": name, "path": str(path), "tier": tier, "version": self.version}
            for name, (path, tier) in self.models.items()
        ]
        config.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
        cmd = [part for part in super().command() if not part.startswith(("--model", f"{MODEL}="))]
        return [*cmd, "--config", str(config)]


def _node(node_id: str, version: str, checkpoint: Path, logs: Path) -> VersionedNode:
    node = VersionedNode(node_id, "eu-west", "eu", {MODEL: (checkpoint, "small")}, logs)
    node.version = version
    return node


@pytest.fixture(scope="module")
def nodes(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    logs = tmp_path_factory.mktemp("node-logs")
    fleet: list[NodeProcess] = [
        _node("old-1", "v1", llama_checkpoint, logs),
        _node("new-1", "v2", llama_checkpoint, logs),
    ]
    try:
        start_nodes(fleet)
        yield fleet
    finally:
        for node in fleet:
            node.stop()


def _config(regions: Path, rollout: dict[str, int] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": MODEL, "tier": "small", "versions": ["v1", "v2"]}
    if rollout is not None:
        entry["rollout"] = {"versions": rollout}
    return gateway_config(regions, catalog=[entry, {"name": "meridian-large", "tier": "large"}])


def _wait_versions_known(gw: RunningGateway, count: int) -> None:
    """Until the gateway has probed every node's /load (versions come from there)."""
    deadline = time.monotonic() + 20
    while True:
        nodes = gw.gateway.fleet.snapshot().nodes
        known = [n for n in nodes if n.healthy and n.load is not None and MODEL in n.load.versions]
        if len(known) == count:
            return
        assert time.monotonic() < deadline, "the gateway never saw every node's version"
        time.sleep(0.1)


def _ask(client: httpx.Client, url: str, *, session: str | None = None, **extra: Any) -> tuple[str, str]:
    """(system_fingerprint, serving node) of one short non-streamed request."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **extra}
    headers = {**HEADERS, "x-meridian-session": session} if session is not None else HEADERS
    response = client.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    return response.json()["system_fingerprint"], response.headers["x-meridian-node"]


@pytest.fixture
def rolled(nodes: list[NodeProcess], tmp_path: Path) -> Iterator[tuple[RunningGateway, Path, dict[str, Any]]]:
    start_nodes(nodes)
    regions = write_regions(tmp_path / "regions.yaml", nodes)
    config = _config(regions, {"v1": 10, "v2": 90})
    path = tmp_path / "gateway.yaml"
    with run_gateway(config, path=path) as gw:
        _wait_versions_known(gw, len(nodes))
        yield gw, path, config


def test_a_thousand_sessions_split_by_the_weights_and_stay(rolled) -> None:
    gw, _, _ = rolled
    n = 1000
    with httpx.Client() as client, ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda i: _ask(client, gw.url, user=f"user-{i}"), range(n)))
        again = [_ask(client, gw.url, user=f"user-{i}") for i in range(0, n, 50)]
    versions = Counter(version for version, _ in served)
    assert set(versions) == {"v1", "v2"}
    sigma = math.sqrt(n * 0.1 * 0.9)
    assert abs(versions["v1"] - n * 0.1) <= 4 * sigma, versions
    # The version a session gets is the node it is served by: old-1 is v1, new-1 is v2.
    assert all(node == ("old-1" if version == "v1" else "new-1") for version, node in served)
    assert again == served[::50]  # sticky: the same user, the same version


def test_the_session_header_is_sticky_and_streams_name_the_version(rolled) -> None:
    gw, _, _ = rolled
    canary = next(
        f"s{i}" for i in range(1000) if choose_version(Rollout((("v1", 10), ("v2", 90))), f"s{i}") == "v1"
    )
    with httpx.Client() as client:
        for _ in range(10):
            assert _ask(client, gw.url, session=canary, user="ignored")[0] == "v1"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
            "stream": True,
        }
        headers = {**HEADERS, "x-meridian-session": canary}
        with client.stream(
            "POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=TIMEOUT_S
        ) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks and all(chunk["system_fingerprint"] == "v1" for chunk in chunks)


def test_a_reload_to_zero_moves_every_session_at_once(rolled) -> None:
    gw, path, config = rolled
    plan = Rollout((("v1", 10), ("v2", 90)))
    canaries = [f"user-{i}" for i in range(300) if choose_version(plan, f"user-{i}") == "v1"][:10]
    with httpx.Client() as client:
        assert {_ask(client, gw.url, user=u)[0] for u in canaries} == {"v1"}
        config["catalog"][0]["rollout"] = {"versions": {"v1": 0, "v2": 100}}
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        deadline = time.monotonic() + 20
        while gw.gateway.pipeline.rollouts.current()[MODEL].weights != (("v1", 0), ("v2", 100)):
            assert time.monotonic() < deadline, "the gateway did not reload its rollout"
            time.sleep(0.05)
        assert {_ask(client, gw.url, user=u)[0] for u in canaries} == {"v2"}


def test_a_broken_stream_is_never_continued_on_another_version(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    """No rollout: either version may start the stream, but its continuation may only go to the
    same version; with no other node of it, the stream ends with an error naming the version."""
    start_nodes(nodes)
    regions = write_regions(tmp_path / "regions.yaml", nodes)
    with run_gateway(_config(regions, None)) as gw:
        _wait_versions_known(gw, len(nodes))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Go on"}], "stream": True}
        body |= {"temperature": 0, "max_tokens": 400, "ignore_eos": True}
        broken = break_stream_midway(gw, nodes, body)
    events = [json.loads(line[6:]) for line in broken.lines if line.startswith("data: {")]
    fingerprints = {e.get("system_fingerprint") for e in events if "error" not in e}
    errors = [e["error"]["message"] for e in events if "error" in e]
    serving = broken.serving
    version = "v1" if serving.node_id == "old-1" else "v2"
    assert fingerprints == {version}
    assert len(errors) == 1 and f"version '{version}'" in errors[0], errors

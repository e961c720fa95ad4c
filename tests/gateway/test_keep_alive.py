"""Idle connections never fail a request: gateway → node keep-alive, end to end.

One node, the only one its tenant may use, keeps idle connections for 2 s (`server.keep_alive_s`)
and says so in every response; the gateway reaches it through a proxy that makes the keep-alive
race certain (tests/support/idle_closer.py): a request that arrives on a connection idle for the
node's keep-alive or longer meets the node's close and is dropped unanswered. Requests after an
idle gap must still get 200, with nothing held against the node.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.config import ConfigError
from gateway.health import BreakerState
from regional_node.server.config import ConfigError as NodeConfigError
from regional_node.server.config import convert_config
from tests.gateway.conftest import (
    AUTH,
    GLOBAL_KEY,
    NodeProcess,
    RunningGateway,
    gateway_config,
    run_gateway,
    start_nodes,
)
from tests.support.gateway_config import gateway_config as gateway_settings
from tests.support.idle_closer import IdleCloser, idle_closer

NODE_KEEP_ALIVE_S = 2
GATEWAY_KEEP_ALIVE_S = 3
CHAT = {"model": "meridian-small", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


class ConfiguredNode(NodeProcess):
    """A node started with a config file (here: its keep-alive) as well as the usual flags."""

    def __init__(self, config_file: Path, *args: Any) -> None:
        super().__init__(*args)
        self.config_file = config_file

    def command(self) -> list[str]:
        return [*super().command(), "--config", str(self.config_file)]


@pytest.fixture(scope="module")
def node(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    work = tmp_path_factory.mktemp("keep-alive-node")
    config_file = work / "node.yaml"
    config_file.write_text(yaml.safe_dump({"server": {"keep_alive_s": NODE_KEEP_ALIVE_S}}), encoding="utf-8")
    models = {"meridian-small": (llama_checkpoint, "small")}
    node = ConfiguredNode(config_file, "us-east-1", "us-east", "us", models, work)
    try:
        start_nodes([node])
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def proxy(node: NodeProcess) -> Iterator[IdleCloser]:
    with idle_closer(node.port, close_after_s=NODE_KEEP_ALIVE_S) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def gw(proxy: IdleCloser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    regions = tmp_path_factory.mktemp("keep-alive-gw") / "regions.yaml"
    entry = {
        "node_id": "us-east-1",
        "url": proxy.url,
        "region": "us-east",
        "jurisdiction": "us",
        "models": ["meridian-small"],
    }
    regions.write_text(yaml.safe_dump({"nodes": [entry]}), encoding="utf-8")
    config = gateway_config(regions, home_region="us-east", server={"keep_alive_s": GATEWAY_KEEP_ALIVE_S})
    with run_gateway(config) as running:
        deadline = time.monotonic() + 20
        while httpx.get(running.url + "/health", timeout=5).json()["healthy_nodes"] < 1:
            assert time.monotonic() < deadline, "the gateway never saw the node ready"
            time.sleep(0.1)
        yield running


def chat(gw: RunningGateway, *, stream: bool = False) -> httpx.Response:
    return httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={**CHAT, "stream": stream},
        headers={"authorization": f"Bearer {GLOBAL_KEY}"},
        timeout=30,
    )


def node_failures(gw: RunningGateway) -> dict[str, Any]:
    """What the gateway holds against the node."""
    attempts = "meridian_gateway_upstream_attempts_total"
    labels = {"target": "us-east-1", "region": "us-east"}
    return {
        "retryable": gw.metric(attempts, **labels, outcome="retryable"),
        "broken": gw.metric(attempts, **labels, outcome="broken"),
        "state": gw.gateway.board.state("us-east-1"),
        "available": gw.gateway.board.available("us-east-1"),
    }


NO_FAILURE = {"retryable": 0.0, "broken": 0.0, "state": BreakerState.CLOSED, "available": True}


@pytest.mark.parametrize("value", [0, 1.5, "5s"])
def test_keep_alive_is_a_whole_positive_number_of_seconds_in_both_configs(value: object) -> None:
    # Whole seconds: what uvicorn takes and what `Keep-Alive: timeout=N` can say.
    with pytest.raises(ConfigError, match=r"\$\.server\.keep_alive_s"):
        gateway_settings(server={"keep_alive_s": value})
    with pytest.raises(NodeConfigError, match=r"node\.yaml: server\.keep_alive_s"):
        convert_config({"server": {"keep_alive_s": value}}, source="node.yaml")
    # Nodes keep idle connections 5 s (the gateway's client honours it); the gateway keeps its
    # clients' 65 s, longer than clients that never expire idle connections wait between requests.
    assert convert_config({}, source="-").server.keep_alive_s == 5
    assert gateway_settings().server.keep_alive_s == 65
    assert gateway_settings(server={"max_connections": 10}).server.keep_alive_s == 65


def test_node_and_gateway_say_how_long_they_keep_an_idle_connection(
    node: NodeProcess, gw: RunningGateway
) -> None:
    node_response = httpx.get(node.url + "/health", headers=AUTH, timeout=5)
    assert node_response.headers["keep-alive"] == f"timeout={NODE_KEEP_ALIVE_S}"
    assert chat(gw).headers["keep-alive"] == f"timeout={GATEWAY_KEEP_ALIVE_S}"
    assert httpx.get(gw.url + "/health", timeout=5).headers["keep-alive"] == f"timeout={GATEWAY_KEEP_ALIVE_S}"


def test_after_an_idle_gap_longer_than_the_nodes_keep_alive_a_request_goes_on_a_new_connection(
    gw: RunningGateway, proxy: IdleCloser
) -> None:
    proxy.close_after_s = NODE_KEEP_ALIVE_S
    assert chat(gw).status_code == 200
    raced = proxy.raced
    time.sleep(NODE_KEEP_ALIVE_S + 0.3)
    for stream in (False, True):
        response = chat(gw, stream=stream)
        assert response.status_code == 200, response.text
    assert proxy.raced == raced  # nothing was written on a connection the node was closing
    assert node_failures(gw) == NO_FAILURE


def test_a_request_that_meets_the_nodes_idle_close_is_sent_again_and_not_held_against_the_node(
    gw: RunningGateway, proxy: IdleCloser
) -> None:
    proxy.close_after_s = 0.0  # every reused connection meets the node's close
    assert chat(gw).status_code == 200
    raced = proxy.raced
    for stream in (False, True, False, True):
        response = chat(gw, stream=stream)
        assert response.status_code == 200, response.text
        if stream:
            assert response.text.rstrip().endswith("data: [DONE]")
    assert proxy.raced > raced  # the race happened, and lost no request
    assert node_failures(gw) == NO_FAILURE

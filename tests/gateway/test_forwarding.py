"""Failover before the first byte, with scripted upstreams: how many targets one request may try."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import RetryConfig
from gateway.health.ejection import Ejections
from gateway.metrics import GatewayMetrics
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import Forwarder
from protocol import ServiceUnavailableError
from router import MAX_ATTEMPTS_BOUND
from router.types import Target


class _FailingUpstream:
    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, endpoint: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        self.calls += 1
        raise UpstreamError("boom", status_code=503)


class _Fleet:
    def __init__(self) -> None:
        self.ejections = Ejections(base_s=1.0, max_s=2.0)
        self.upstream = _FailingUpstream()

    def upstream_for(self, target: Target) -> _FailingUpstream:
        return self.upstream


async def test_attempts_never_exceed_the_bound_whatever_the_config_says() -> None:
    fleet = _Fleet()
    retry = RetryConfig(max_attempts=MAX_ATTEMPTS_BOUND + 5, backoff_base_s=0.0, backoff_max_s=0.0)
    forwarder = Forwarder(fleet, GatewayMetrics(), retry=retry, stream_idle_s=1.0)  # type: ignore[arg-type]
    targets = [Target("node", f"n{i}", f"http://n{i}", "eu-west", "eu", "m", "r") for i in range(20)]
    with pytest.raises(ServiceUnavailableError):
        await forwarder.complete(targets, "chat", lambda t: {}, {})
    assert fleet.upstream.calls == MAX_ATTEMPTS_BOUND

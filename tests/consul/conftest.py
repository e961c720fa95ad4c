"""Fixtures for Consul discovery tests: a running stand-in (tests/consul_api) and clients for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from protocol.consul.client import ConsulClient, ConsulConfig
from tests.consul_api import ConsulStandIn

# Fast reaping so DeregisterCriticalServiceAfter is testable in seconds (Consul: >= 1 m, every 30 s).
REAP = {"min_deregister_after_s": 0.0, "reap_interval_s": 0.1}


@pytest.fixture
def consul() -> Iterator[ConsulStandIn]:
    """Two WAN-federated datacenters, "eu" and "us", each with its own agent."""
    with ConsulStandIn(("eu", "us"), **REAP) as stand_in:
        yield stand_in


@pytest.fixture
async def client(consul: ConsulStandIn) -> AsyncIterator[ConsulClient]:
    """A client of the "eu" agent."""
    async with ConsulClient(ConsulConfig(address=consul.address("eu"), wait_s=2.0)) as c:
        yield c

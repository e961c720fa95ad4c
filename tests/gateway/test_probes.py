"""Active probes with a scripted HTTP transport: one bad node must not freeze everyone's health."""

from __future__ import annotations

import httpx

from gateway.health.probes import NodeProber
from router.types import NodeInfo


class _Directory:
    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.nodes = nodes

    def snapshot(self) -> tuple[NodeInfo, ...]:
        return tuple(self.nodes)


def _node(node_id: str, url: str) -> NodeInfo:
    return NodeInfo(node_id=node_id, url=url, region="eu-west", jurisdiction="eu", models=frozenset({"m"}))


async def test_a_node_with_an_invalid_url_is_not_ready_and_the_others_are_still_probed() -> None:
    directory = _Directory([_node("good", "http://good")])
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    async with httpx.AsyncClient(transport=transport) as client:
        prober = NodeProber(directory, client, interval_s=1.0, timeout_s=1.0, headers={})
        await prober.probe_all()
        result = prober.result("good")
        assert result is not None and result.ready
        directory.nodes.append(_node("bad", "http://bad:notaport"))
        transport.handler = lambda request: httpx.Response(503)  # the good node goes down
        await prober.probe_all()
        good, bad = prober.result("good"), prober.result("bad")
        assert good is not None and not good.ready, "health must not freeze at its last value"
        assert bad is not None and not bad.ready

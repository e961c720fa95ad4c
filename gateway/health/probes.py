"""Active health probes: every node's `/ready` and `/load`, about once a second, short timeouts.

Results feed NodeInfo.healthy and NodeInfo.load in the fleet snapshot. A node the prober has not
heard from yet counts as not ready, so a node added to the directory gets traffic only after
its first successful probe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import msgspec

from gateway.discovery.interface import RegionDirectory
from gateway.runtime.tasks import cancel_and_wait
from protocol.load import LoadReport
from router.types import NodeInfo, NodeLoad

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeResult:
    ready: bool
    load: NodeLoad | None
    checked_at: float


_load_decoder = msgspec.json.Decoder(LoadReport)


class NodeProber:
    def __init__(
        self,
        directory: RegionDirectory,
        client: httpx.AsyncClient,
        *,
        interval_s: float,
        timeout_s: float,
        headers: dict[str, str],
        on_result: Callable[[NodeInfo, ProbeResult], None] | None = None,
    ) -> None:
        self._directory = directory
        self._client = client
        self._interval_s = interval_s
        self._timeout = httpx.Timeout(timeout_s)
        self._headers = headers
        self._on_result = on_result
        self._results: dict[str, ProbeResult] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # One round before serving, so the first requests route on facts rather than guesses.
        await self.probe_all()
        self._task = asyncio.create_task(self._loop(), name="node-prober")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def result(self, node_id: str) -> ProbeResult | None:
        return self._results.get(node_id)

    async def probe_all(self) -> None:
        nodes = self._directory.snapshot()
        results = await asyncio.gather(*(self._probe(node) for node in nodes))
        # Nodes that left the directory are forgotten; a node that comes back starts unknown.
        self._results = {node.node_id: result for node, result in zip(nodes, results, strict=True)}
        if self._on_result is not None:
            for node, result in zip(nodes, results, strict=True):
                self._on_result(node, result)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.probe_all()
            except Exception:  # a probe round must never kill the prober
                logger.exception("health probe round failed")

    async def _probe(self, node: NodeInfo) -> ProbeResult:
        ready, load = await asyncio.gather(self._ready(node), self._load(node))
        return ProbeResult(ready=ready, load=load, checked_at=time.monotonic())

    async def _ready(self, node: NodeInfo) -> bool:
        try:
            response = await self._client.get(
                node.url + "/ready", headers=self._headers, timeout=self._timeout
            )
        except (httpx.HTTPError, httpx.InvalidURL):  # a bad URL must not end the whole round
            return False
        return response.status_code == 200

    async def _load(self, node: NodeInfo) -> NodeLoad | None:
        try:
            response = await self._client.get(
                node.url + "/load", headers=self._headers, timeout=self._timeout
            )
            if response.status_code != 200:
                return None
            report = _load_decoder.decode(response.content)
        except (httpx.HTTPError, httpx.InvalidURL, msgspec.DecodeError):
            return None
        return NodeLoad(
            kv_cache_usage=report.kv_cache_usage,
            waiting_tokens=report.waiting_tokens,
            num_running=report.num_running,
            num_waiting=report.num_waiting,
        )

"""Active probes against a real HTTP server: one bad node must not freeze everyone's health, and
a node's load report is read; probes carry the node credential."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator

import pytest

from gateway.health import BreakerBoard, ejection
from gateway.health.probes import NodeProber, ProbeResult
from gateway.http import ConnectionPool
from gateway.metrics import GatewayMetrics
from gateway.upstreams.fleet import Fleet, NoProviders
from router.load import load_facts
from router.params import DEFAULT_PARAMS
from router.types import NodeInfo, Overlaid, Prefill, Target


class _Directory:
    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.nodes = nodes

    def snapshot(self) -> tuple[NodeInfo, ...]:
        return tuple(self.nodes)


class _Node:
    """A node's /ready and /load over real HTTP/1.1 (keep-alive), with a status a test sets."""

    def __init__(self) -> None:
        self.status = 200
        self.authorizations: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split()[1]
                for line in lines[1:]:
                    if line.lower().startswith("authorization:"):
                        self.authorizations.append(line.split(":", 1)[1].strip())
                body = json.dumps(
                    {"kv_cache_usage": 0.25, "num_running": 3} if path == "/load" else {}
                ).encode()
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (self.status, len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def node() -> AsyncIterator[tuple[_Node, str]]:
    fake = _Node()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield fake, f"http://127.0.0.1:{port}"


def _node(node_id: str, url: str) -> NodeInfo:
    return NodeInfo(node_id=node_id, url=url, region="eu-west", jurisdiction="eu", models=frozenset({"m"}))


async def test_a_node_with_an_invalid_url_is_not_ready_and_the_others_are_still_probed(node) -> None:
    fake, url = node
    directory = _Directory([_node("good", url)])
    pool = ConnectionPool(connect_timeout_s=1.0)
    prober = NodeProber(directory, pool, interval_s=1.0, timeout_s=1.0, headers={"authorization": "Bearer t"})
    try:
        await prober.probe_all()
        result = prober.result("good")
        assert result is not None and result.ready
        assert result.load is not None and result.load.kv_cache_usage == 0.25 and result.load.num_running == 3
        assert fake.authorizations and set(fake.authorizations) == {"Bearer t"}
        directory.nodes.append(_node("bad", "http://bad:notaport"))
        fake.status = 503  # the good node goes down
        await prober.probe_all()
        good, bad = prober.result("good"), prober.result("bad")
        assert good is not None and not good.ready and good.load is None, "health must not freeze"
        assert bad is not None and not bad.ready
    finally:
        await pool.aclose()


async def test_a_node_that_does_not_answer_is_not_ready() -> None:
    silent = await asyncio.start_server(lambda r, w: asyncio.sleep(5), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    pool = ConnectionPool(connect_timeout_s=0.2)
    prober = NodeProber(
        _Directory([_node("mute", f"http://127.0.0.1:{port}")]),
        pool,
        interval_s=1.0,
        timeout_s=0.2,
        headers={},
    )
    try:
        async with silent:
            await prober.probe_all()
        result = prober.result("mute")
        # Never heard from: not ready, however its silence is tolerated once it was.
        assert result is not None and not result.ready and result.load is None and result.missed == 1
    finally:
        await pool.aclose()


class _FlakyNode(_Node):
    """Answers /ready with `status` and /load with 200, except the paths in `silent`, which it
    never answers (so their probe times out): a node too busy to answer in time."""

    def __init__(self) -> None:
        super().__init__()
        self.silent: set[bytes] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                path = head.split(b" ", 2)[1].split(b"?")[0]
                if path in self.silent:
                    await asyncio.sleep(5)
                    return
                status = 200 if path == b"/load" else self.status
                body = json.dumps({"waiting_tokens": 500} if path == b"/load" else {}).encode()
                writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_missed_load_report_keeps_the_last_one_for_a_few_rounds() -> None:
    """A busy node that misses one /load answer must not look idle for that round."""
    fake = _FlakyNode()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = ConnectionPool(connect_timeout_s=0.2)
    prober = NodeProber(_Directory([_node("busy", url)]), pool, interval_s=10.0, timeout_s=0.2, headers={})
    try:
        async with server:
            await prober.probe_all()
            first = prober.result("busy")
            assert first is not None and first.load is not None and first.load.waiting_tokens == 500
            fake.silent = {b"/load"}
            await prober.probe_all()
            second = prober.result("busy")
            assert second is not None and second.ready
            assert second.load is not None and second.load.waiting_tokens == 500  # carried over
            assert second.load_at == first.load_at
    finally:
        await pool.aclose()


async def test_a_ready_node_that_misses_probes_stays_routed_until_it_misses_probe_misses_in_a_row() -> None:
    """A busy node whose event loop cannot answer /ready in time is not taken out of routing for
    one miss (with one node per model that would refuse every request for a round): only
    `misses` unanswered probes in a row take it out, and an answer brings it back. Its last
    /load is carried meanwhile; the metric counts each miss."""
    fake = _FlakyNode()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = ConnectionPool(connect_timeout_s=0.2)
    metrics = GatewayMetrics()
    prober = NodeProber(
        _Directory([_node("busy", url)]),
        pool,
        interval_s=10.0,
        timeout_s=0.2,
        headers={},
        misses=3,
        metrics=metrics,
    )

    def missed_total() -> float:
        labels = {"node_id": "busy", "region": "eu-west"}
        return metrics.registry.get_sample_value("meridian_gateway_node_probe_missed_total", labels) or 0.0

    async def probe() -> ProbeResult:
        await prober.probe_all()
        result = prober.result("busy")
        assert result is not None
        return result

    try:
        async with server:
            first = await probe()
            assert first.ready and first.missed == 0 and first.load is not None
            fake.silent = {b"/ready", b"/load"}
            for missed in (1, 2):
                late = await probe()
                assert (late.ready, late.missed, missed_total()) == (True, missed, missed)
                assert late.load is not None and late.load_at == first.load_at  # carried over
            out = await probe()
            assert (out.ready, out.missed, missed_total()) == (False, 3, 3)
            assert out.load is None
            assert (await probe()).ready is False  # out until it answers

            fake.silent = set()
            back = await probe()
            assert back.ready and back.missed == 0 and back.load is not None
            fake.silent = {b"/ready"}
            assert (await probe()).ready  # the count starts again
    finally:
        await pool.aclose()


async def test_a_node_that_says_it_is_not_ready_or_refuses_the_probe_is_out_at_once() -> None:
    """Only silence is tolerated: an answer other than 200, or a refused connection, takes a ready
    node out of routing on that probe."""
    fake = _FlakyNode()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = ConnectionPool(connect_timeout_s=0.2)
    prober = NodeProber(
        _Directory([_node("n", url)]), pool, interval_s=10.0, timeout_s=0.2, headers={}, misses=3
    )
    try:
        async with server:
            await prober.probe_all()
            assert prober.result("n").ready  # type: ignore[union-attr]
            fake.status = 503  # draining, or its models fail their probes
            await prober.probe_all()
            assert not prober.result("n").ready  # type: ignore[union-attr]
            fake.status = 200
            await prober.probe_all()
            assert prober.result("n").ready  # type: ignore[union-attr]
            # Its process is gone: the port refuses connections.
            server.close()
            await server.wait_closed()
            await pool.aclose()  # no kept-alive connection to it either
            await prober.probe_all()
            refused = prober.result("n")
            assert refused is not None and not refused.ready and refused.missed == 0
    finally:
        await pool.aclose()


async def test_a_request_routed_to_one_node_rebuilds_only_that_nodes_entry_of_the_fleet(node) -> None:
    """Every routed request changes its node's overlay, and routing asks for the fleet twice per
    request: the other nodes' entries stay the same objects (what routing derived from their
    reports stays derived), and so does the routed node's report's derived state."""
    _, url = node
    directory = _Directory([_node(f"n{i}", url) for i in range(3)])
    pool = ConnectionPool(connect_timeout_s=1.0)
    prober = NodeProber(directory, pool, interval_s=1.0, timeout_s=1.0, headers={})
    fleet = Fleet(directory, prober, BreakerBoard(ejection(1.0, 2.0)), NoProviders(), lambda *_: None)  # type: ignore[arg-type,return-value]
    try:
        await prober.probe_all()
        first = fleet.snapshot()
        assert fleet.snapshot() is first  # nothing changed: the same snapshot
        load_facts(first.nodes[0].load, DEFAULT_PARAMS)  # derived from n0's report

        target = Target("node", "n0", url, "eu-west", "eu", "m", "test")
        fleet.routed(target, Prefill(prefixes={"p": 64}, uncached_tokens=64), "r1")
        second = fleet.snapshot()

        assert second is not first
        assert second.nodes[1] is first.nodes[1] and second.nodes[2] is first.nodes[2]
        routed = second.nodes[0].load
        assert routed is not None and routed.overlay is not None and routed.overlay.unreported == 1
        assert routed.derived is first.nodes[0].load.derived and "facts" in routed.derived
        assert fleet.snapshot() is second

        def overlay() -> Overlaid | None:
            load = fleet.snapshot().nodes[0].load
            return load.overlay if load is not None else None

        # n0 starts streaming its answer: its entry alone is rebuilt, the request waits no more
        # (it runs), and "p" is cached there; then the answer ends.
        fleet.answered("r1", target, target, ended=False)
        answered = fleet.snapshot()
        assert answered.nodes[1] is first.nodes[1] and answered.nodes[2] is first.nodes[2]
        running = overlay()
        assert running is not None and (running.unreported, running.unreported_running) == (0, 1)
        assert running.prefilled == {"p"}
        fleet.ended("r1", target)
        done = overlay()
        assert done is not None and (done.unreported, done.unreported_running, done.prefilled) == (
            0,
            0,
            {"p"},
        )

        # Another node answers one routed to n0 (n0 failed it): it leaves n0's overlay.
        fleet.routed(target, Prefill(prefixes={"q": 32}, uncached_tokens=32), "r2")
        fleet.answered("r2", target, dataclasses.replace(target, target_id="n1"), ended=True)
        gone = overlay()
        assert gone is not None and gone.unreported == 0 and set(gone.prefixes) == {"p"}

        await prober.probe_all()  # fresh reports: every entry is rebuilt
        third = fleet.snapshot()
        assert all(a is not b for a, b in zip(third.nodes, second.nodes, strict=True))
        assert "facts" not in third.nodes[1].load.derived
    finally:
        await pool.aclose()

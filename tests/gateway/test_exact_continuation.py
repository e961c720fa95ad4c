"""A stream cut after any SSE event is continued exactly: the client gets the same text, token ids
and finish_reason as from an unbroken stream, including where the node was holding text back for
a possible stop string when the cut came.

One real node process behind two real TCP proxies, which the gateway's directory lists as two
nodes. A proxy cuts the first chat stream it carries after k SSE events by resetting both
connections, so the gateway sees what it sees when a node is SIGKILLed mid-stream (a ReadError),
and continues the stream through the other proxy. Every k of one short run is tried.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.conftest import (
    GLOBAL_KEY,
    RunningGateway,
    gateway_config,
    run_gateway,
    running_fleet,
)
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

MODEL = "meridian-small"
MAX_TOKENS = 24
REQUEST_TIMEOUT_S = 30.0
# Each SSE event is one HTTP chunk from the node: `data: {...}\n\n` then the chunk's CRLF.
EVENT_END = b"\n\n\r\n"


class Cuts:
    """How many SSE events each of the next chat streams (through any proxy) gets before its cut."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: list[int] = []

    def arm(self, *events: int) -> None:
        with self._lock:
            self._next = list(events)

    def take(self) -> int | None:
        with self._lock:
            return self._next.pop(0) if self._next else None

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._next)


class CuttingProxy:
    """A TCP proxy to one node. Requests pass unchanged; a chat stream's response is cut where
    `cuts` says, by resetting the gateway's connection and closing the node's."""

    def __init__(self, node_port: int, cuts: Cuts) -> None:
        self.port = free_port()
        self._node_port = node_port
        self._cuts = cuts

    async def start(self) -> asyncio.Server:
        return await asyncio.start_server(self._connection, "127.0.0.1", self.port)

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            node_r, node_w = await asyncio.open_connection("127.0.0.1", self._node_port)
        except OSError:
            client_w.close()
            return
        cut_after: list[int | None] = [None]  # for the request in flight on this connection

        async def requests() -> None:
            while data := await client_r.read(65536):
                if data.startswith(b"POST /v1/chat/completions"):
                    cut_after[0] = self._cuts.take()
                node_w.write(data)
                await node_w.drain()
            node_w.close()

        async def responses() -> None:
            held = b""
            events = 0
            while data := await node_r.read(65536):
                budget = cut_after[0]
                if budget is None:
                    client_w.write(data)
                    await client_w.drain()
                    continue
                held += data
                sent = 0
                while events < budget and (end := held.find(EVENT_END, sent)) >= 0:
                    sent, events = end + len(EVENT_END), events + 1
                client_w.write(held[:sent])
                await client_w.drain()
                held = held[sent:]
                if events >= budget:
                    reset(client_w)
                    node_w.close()
                    return
            client_w.close()

        tasks = [asyncio.create_task(requests()), asyncio.create_task(responses())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            node_w.close()
            client_w.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, as the kernel does for a killed process's socket with data in flight."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextmanager
def proxies(node_port: int, cuts: Cuts, count: int) -> Iterator[list[CuttingProxy]]:
    """`count` proxies to one node, served by an event loop in a background thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-cutting-proxies", daemon=True)
    thread.start()
    started = [CuttingProxy(node_port, cuts) for _ in range(count)]
    servers = [asyncio.run_coroutine_threadsafe(p.start(), loop).result(10) for p in started]
    try:
        yield started
    finally:
        asyncio.run_coroutine_threadsafe(shut_down(servers), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def shut_down(servers: list[asyncio.Server]) -> None:
    """Close the listeners and end the connections still open (the gateway keeps idle ones), so
    no connection task is left pending when the loop goes."""
    for server in servers:
        server.close()
    pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


@dataclass
class Received:
    chunks: list[tuple[list[int], str]] = field(default_factory=list)  # (token ids, text) with either
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    done: bool = False

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.chunks)

    @property
    def token_ids(self) -> list[int]:
        return [t for ids, _ in self.chunks for t in ids]


def chat(gw: RunningGateway, body: dict[str, Any]) -> Received:
    out = Received()
    headers = {"authorization": f"Bearer {GLOBAL_KEY}"}
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=REQUEST_TIMEOUT_S
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out.done = True
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                out.error = event["error"]
            for choice in event.get("choices", []):
                ids, text = choice.get("token_ids") or [], choice["delta"].get("content") or ""
                if ids or text:
                    out.chunks.append((ids, text))
                out.finish_reason = choice.get("finish_reason") or out.finish_reason
    return out


@dataclass
class Setup:
    gw: RunningGateway
    cuts: Cuts


@pytest.fixture(scope="module")
def setup(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("exact-continuation")
    cuts = Cuts()
    placement = [("node-1", "eu-west", "eu")]
    with (
        running_fleet(placement, {MODEL: (llama_checkpoint, "small")}, work) as [node],
        proxies(node.port, cuts, 2) as (first, second),
    ):
        regions = work / "regions.yaml"
        entries = [
            {"node_id": name, "url": f"http://127.0.0.1:{proxy.port}", "region": "eu-west"}
            | {"jurisdiction": "eu", "models": [MODEL]}
            for name, proxy in (("node-a", first), ("node-b", second))
        ]
        regions.write_text(yaml.safe_dump({"nodes": entries}), encoding="utf-8")
        # Nodes a cut ejects are back at once, so every k finds both to route to.
        config = gateway_config(regions, ejection={"base_s": 0.05, "max_s": 0.1})
        config["timeouts"] |= {"probe_interval_s": 0.1}
        with run_gateway(config) as gw:
            yield Setup(gw, cuts)


def both_nodes_healthy(gw: RunningGateway) -> None:
    deadline = time.monotonic() + 10
    while httpx.get(gw.url + "/health").json()["healthy_nodes"] < 2:
        assert time.monotonic() < deadline, "the gateway did not readmit the proxies' node"
        time.sleep(0.02)


def request(stop: list[str]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
        "ignore_eos": True,
        "stop": stop,
    }


def stops_held_back_often(gw: RunningGateway) -> list[str]:
    """Stop strings that never match but whose first characters are the text's commonest, so the
    node holds text back at many chunk boundaries; plus one that matches near the end."""
    both_nodes_healthy(gw)
    text = chat(gw, request([])).text
    common = [c for c, _ in Counter(text).most_common(3)]
    matching = text[-6:-3]
    return [f"{c}☃☃" for c in common] + [matching]


def test_a_stream_cut_after_any_event_reaches_the_client_exactly_as_unbroken(setup: Setup) -> None:
    gw, cuts = setup.gw, setup.cuts
    body = request(stops_held_back_often(gw))
    both_nodes_healthy(gw)
    whole = chat(gw, body)
    assert whole.finish_reason == "stop" and whole.error is None and whole.done
    assert any(not text for _, text in whole.chunks), "text was held back at some chunk"
    # The role chunk, one chunk per token, the finish chunk, the usage chunk and [DONE].
    events = 1 + len(whole.token_ids) + 3
    continued = gw.metric("meridian_gateway_failovers_total", kind="continuation")
    for k in range(events + 1):
        both_nodes_healthy(gw)
        cuts.arm(k)
        got = chat(gw, body)
        assert cuts.pending == 0, f"the stream cut after {k} events went through no proxy"
        assert (got.text, got.token_ids, got.finish_reason, got.error, got.done) == (
            whole.text,
            whole.token_ids,
            whole.finish_reason,
            None,
            True,
        ), f"cut after {k} of {events} events"
    assert gw.metric("meridian_gateway_failovers_total", kind="continuation") > continued


def test_a_stream_cut_on_both_nodes_says_no_other_node_could_continue_it(setup: Setup) -> None:
    gw, cuts = setup.gw, setup.cuts
    both_nodes_healthy(gw)
    cuts.arm(4, 2)
    got = chat(gw, request([]))
    assert got.error is not None and got.done
    message = got.error["message"]
    assert "no other upstream could continue it" in message
    assert "2 nodes already tried for this request" in message
    assert "region" not in message.lower() and "residency" not in message

"""A client that leaves releases everything its request held, at once, whatever the upstream is
doing: even an upstream that has gone silent (a long prompt, a stalled node) is let go of, and
the tenant's concurrency slot comes back, long before the upstream would speak again. Whether the
client was waiting for a whole answer, for a stream's first chunk, or reading a stream.

The upstream sends its first frames (none, for the first two), then nothing until the gateway
lets go of it. The tenant may hold one request at a time, so its next request is admitted only
once the first is settled. Hypothesis drives the front door (chat, completions, Anthropic's
messages, the Responses API, whose run is a task of its own), the phase, where the client leaves
(after how many frames, by a close or a reset) and how the frames are cut into the upstream's
writes. A request left before its answer began is counted as 499.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.policy import key_digest
from router.types import TenantLimits, TenantPolicy
from tests.gateway.conftest import RunningGateway, gateway_config, run_gateway
from tests.support.leaving import leave
from tests.support.stream_node import answer_probe, begin_stream, one_node_regions, serve_node
from tests.support.waiting import wait_for

ONE_AT_A_TIME_KEY = "sk-test-one-at-a-time"
SILENCE_S = 120.0  # the upstream's silence: far past every deadline below
RELEASE_S = 20.0  # generous: a loaded 2-core box still lets go within a second or two


def _frame(i: int, path: str) -> bytes:
    """A chunk of the node's chat stream, or of its text completion stream."""
    if path == "/v1/completions":
        choice: dict[str, Any] = {"index": 0, "text": f"t{i} ", "finish_reason": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
        obj = "chat.completion.chunk"
    chunk = {"id": "leave", "object": obj, "created": 1, "model": "meridian-small", "choices": [choice]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class SilentUpstream:
    """/ready, /load, and a chat stream of `frames` frames (in `writes` writes), then silence
    until the gateway lets go; `released` counts the streams the gateway let go of."""

    def __init__(self) -> None:
        self.frames = 1
        self.writes = 1
        self.opened = 0
        self.released = 0
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or await answer_probe(scope, send):
            return
        await begin_stream(receive, send)
        with self._lock:
            self.opened += 1
        data = b"".join(_frame(i, scope["path"]) for i in range(self.frames))
        step = max(1, -(-len(data) // self.writes))
        for start in range(0, len(data), step):
            await send({"type": "http.response.body", "body": data[start : start + step], "more_body": True})
        try:
            message = await asyncio.wait_for(receive(), SILENCE_S)
            assert message["type"] == "http.disconnect"
        finally:
            with self._lock:
                self.released += 1


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, SilentUpstream]]:
    app = SilentUpstream()
    with serve_node(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def gateway(
    upstream: tuple[str, SilentUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    url, _ = upstream
    regions = one_node_regions(tmp_path_factory.mktemp("leaves"), "silent", url)
    tenant = TenantPolicy(
        tenant_id="t-one-at-a-time",
        api_key_hashes=frozenset({key_digest(ONE_AT_A_TIME_KEY)}),
        limits=TenantLimits(concurrent_requests=1),
    )
    # The upstream's silence must outlast the gateway's own patience with it.
    config = gateway_config(regions, timeouts={"stream_idle_s": SILENCE_S * 2, "read_s": SILENCE_S * 2})
    with run_gateway(config, tenants=[tenant]) as running:
        yield running


# Each front door that generates, with its request body; the gateway serves each from the node's
# chat stream (the Responses door from a run of its own, in a task the request waits on).
DOORS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "go"}]},
    "/v1/completions": {"prompt": "go"},
    "/v1/messages": {"max_tokens": 16, "messages": [{"role": "user", "content": "go"}]},
    "/v1/responses": {"input": "go"},
}


def _send(gateway: RunningGateway, stream: bool, door: str = "/v1/chat/completions") -> socket.socket:
    """A request to `door` on a raw socket, sent in full."""
    port = int(gateway.url.rsplit(":", 1)[1])
    body = json.dumps({"model": "meridian-small", **DOORS[door], "stream": stream}).encode()
    client = socket.create_connection(("127.0.0.1", port), timeout=RELEASE_S)
    client.sendall(
        b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
        % (door.encode(), ONE_AT_A_TIME_KEY.encode(), len(body), body)
    )
    return client


def _status(client: socket.socket) -> bytes:
    """The status code of the response the gateway has begun."""
    head = b""
    while b"\r\n" not in head:
        got = client.recv(1)
        assert got, "the gateway closed the connection before answering"
        head += got
    return head.split(b" ")[1]


def _peeked_status(client: socket.socket) -> bytes:
    """The status code of the response the gateway has begun, left to be read again."""
    while len(got := client.recv(12, socket.MSG_PEEK)) < 12:  # "HTTP/1.1 200"
        assert got, "the gateway closed the connection before answering"
        time.sleep(0.01)
    return got[9:12]


def _admitted(
    gateway: RunningGateway, silent: SilentUpstream, *, stream: bool, door: str = "/v1/chat/completions"
) -> socket.socket:
    """A request that reached the upstream. The slot of the example before may still be on its
    way back (the upstream saw its stream let go of a moment before the gateway settled it): a
    429 then is sent again."""
    opened = silent.opened
    deadline = time.monotonic() + RELEASE_S
    client = _send(gateway, stream, door)
    while silent.opened != opened + 1:
        assert time.monotonic() < deadline, (
            "the request never reached the upstream (its slot never came back?)"
        )
        if select.select([client], [], [], 0.02)[0] and _peeked_status(client) == b"429":
            client.close()
            client = _send(gateway, stream, door)
    return client


def _left(gateway: RunningGateway) -> float:
    """The tenant's requests counted as 499, whatever their model and region."""
    return sum(
        sample.value
        for metric in gateway.gateway.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == "meridian_gateway_requests_total"
        and sample.labels.get("status") == "499"
        and sample.labels.get("tenant") == "t-one-at-a-time"
    )


@settings(max_examples=36, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    door=st.sampled_from(sorted(DOORS)),
    phase=st.sampled_from(["waiting", "opening", "streaming"]),
    frames=st.integers(1, 4),
    writes=st.integers(1, 3),
    read=st.integers(0, 2048),
    reset=st.booleans(),
)
def test_a_client_leaving_a_silent_upstream_releases_it_and_its_slot(
    gateway: RunningGateway,
    upstream: tuple[str, SilentUpstream],
    door: str,
    phase: str,
    frames: int,
    writes: int,
    read: int,
    reset: bool,
) -> None:
    _, silent = upstream
    silent.frames, silent.writes = (frames if phase == "streaming" else 0), writes
    released, left = silent.released, _left(gateway)
    client = _admitted(gateway, silent, stream=phase != "waiting", door=door)
    if phase == "streaming":
        assert _status(client) == b"200"
    # Some of what is already there (never past it: then the upstream is silent).
    leave(client, read=read if phase == "streaming" else 0, reset=reset)

    wait_for(
        lambda: silent.released == released + 1,
        "the gateway kept a silent upstream for a client that had left",
        RELEASE_S,
    )
    if phase != "streaming":  # no answer had begun: the client closed its request
        wait_for(lambda: _left(gateway) == left + 1, "the request was not counted as 499", RELEASE_S)
    # The tenant's one slot is back: its next request is admitted (a 429 until it is settled).
    silent.frames = 1
    _admitted(gateway, silent, stream=True).close()
    wait_for(lambda: silent.released == released + 2, "the second stream was not let go of", RELEASE_S)

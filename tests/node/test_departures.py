"""A client that leaves the node ends its engine request at once, wherever the request was: waiting
for its first token (queued, or prefilling a long prompt), mid-stream, or waiting for a whole
answer. The node app runs under the server config the node's CLI uses (`server_settings`), on a
fake engine that sends a few tokens and then holds (an engine busy elsewhere) until its stream is
closed; hypothesis drives the endpoint's shape, how many tokens come before the hold, how much the
client reads and whether it leaves with a FIN or a reset. The invariant: the engine's stream is
closed and the request aborted within the deadline, long before the hold would end (and the
node, the same one for every example, takes the next request).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regional_node.cli import server_settings
from regional_node.engine import RequestDelta, SamplingParams
from regional_node.server import NodeConfig, ServedModelConfig, create_app
from tests.node.fakes import FakeLLMEngine, FakeRunner
from tests.support.leaving import leave
from tests.support.processes import free_port
from tests.support.threaded_server import running
from tests.support.waiting import wait_for

HOLD_S = 120.0  # the engine's hold: far past the deadline below
DEADLINE_S = 20.0  # generous: a loaded 2-core box ends the request within a second or two


class HoldingRunner(FakeRunner):
    """Sends `tokens` tokens, then holds until its stream is closed; counts what it saw."""

    def __init__(self, engine: FakeLLMEngine) -> None:
        super().__init__(engine)
        self.held = 0  # requests that reached the hold
        self.closed = 0  # engine streams closed (by the node, never by the hold ending)

    async def generate(
        self, prompt: list[int] | str, params: SamplingParams, *, request_id: str | None = None, **_: Any
    ) -> AsyncIterator[RequestDelta]:
        assert request_id is not None
        try:
            for index in range(self.tokens):
                await asyncio.sleep(0)
                yield RequestDelta(
                    request_id=request_id,
                    new_token_ids=[7],
                    new_text="x",
                    new_logprobs=[-0.5],
                    finished=False,
                    finish_reason=None,
                    prompt_tokens=len(prompt),
                    cached_tokens=0,
                    num_output_tokens=index + 1,
                )
            self.held += 1
            await asyncio.sleep(HOLD_S)
        finally:
            self.closed += 1


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[int, HoldingRunner]]:
    runners: list[HoldingRunner] = []

    def load(_: ServedModelConfig) -> HoldingRunner:
        runners.append(HoldingRunner(FakeLLMEngine()))
        return runners[-1]

    port = free_port()
    config = NodeConfig(
        node_id="holding-node",
        port=port,
        models=[ServedModelConfig(name="fake", path="/nowhere")],
        warmup=False,
        log_level="warning",
    )
    with running(server_settings(create_app(config, loader=load), config)):  # type: ignore[arg-type]
        deadline = time.monotonic() + DEADLINE_S
        while not runners or not runners[0].started:
            assert time.monotonic() < deadline, "the fake engine never loaded"
            time.sleep(0.01)
        yield port, runners[0]


def _request(port: int, body: dict[str, Any]) -> socket.socket:
    payload = json.dumps(body).encode()
    client = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    client.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    return client


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stream=st.booleans(),
    tokens=st.integers(0, 3),  # 0: the client leaves before its first token
    read=st.integers(0, 512),
    reset=st.booleans(),
)
def test_a_client_leaving_ends_its_engine_request_in_every_phase(
    node: tuple[int, HoldingRunner], stream: bool, tokens: int, read: int, reset: bool
) -> None:
    port, runner = node
    runner.tokens = tokens
    held, closed, aborted = runner.held, runner.closed, len(runner.aborted)
    body = {"model": "fake", "prompt": [1, 2, 3], "max_tokens": 64, "stream": stream}
    client = _request(port, body)
    wait_for(lambda: runner.held == held + 1, "the request never reached the engine's hold", DEADLINE_S)
    # Where the stream's answer has begun, some of what is there.
    leave(client, read=read if stream and tokens else 0, reset=reset)

    wait_for(
        lambda: runner.closed == closed + 1,
        "the engine's stream was kept for a client that had left",
        DEADLINE_S,
    )
    wait_for(lambda: len(runner.aborted) == aborted + 1, "the engine request was not aborted", DEADLINE_S)

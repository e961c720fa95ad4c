"""A node bounds its queues in prompt tokens per tier: a request that would pass its tier's bound
gets 503 `overloaded` with Retry-After at once, taking nothing; /load and /metrics report the queue.

A node of its own: one model that runs one sequence at a time (max_num_seqs=1) with bounds of
100 prompt tokens per tier. A long batch request holds the one slot, so whatever comes after it
waits, deterministically; closing it lets the queue drain.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.node.conftest import NODE_TOKEN, Node
from tests.support.checkpoints import make_checkpoint
from tests.support.processes import free_port, python_command, start_process

MODEL = "queue"
BOUND = 100
PROMPT = 40  # two fit in a tier's queue, a third does not
BATCH = {"x-meridian-priority": "batch"}
INTERACTIVE = {"x-meridian-priority": "interactive"}


@pytest.fixture(scope="module")
def overload_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    folder = tmp_path_factory.mktemp("overload-node")
    checkpoint = make_checkpoint(folder, "llama", "tiny", max_position_embeddings=32768)
    port = free_port()
    config = folder / "node.yaml"
    config.write_text(
        f"""
node_id: overload-node
port: {port}
models:
  - name: {MODEL}
    path: {checkpoint}
    engine: {{max_num_seqs: 1, num_kv_blocks: 1400}}
    queue: {{interactive_max_waiting_tokens: {BOUND}, batch_max_waiting_tokens: {BOUND}, max_retry_after_s: 30}}
""",
        encoding="utf-8",
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"authorization": f"Bearer {NODE_TOKEN}"}
    with start_process(
        python_command("-m", "regional_node", "node", "--config", str(config), "--log-level", "warning"),
        env={"MERIDIAN_NODE_TOKEN": NODE_TOKEN},
        ready_url=f"{url}/ready",
        ready_headers=headers,
        timeout=90,
    ) as process:
        yield Node(url=url, token=NODE_TOKEN, process=process)


def completion(seed: int, *, max_tokens: int = 2, stream: bool = False) -> dict[str, Any]:
    prompt = [(seed * 37 + i) % 2000 for i in range(PROMPT)]
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, "ignore_eos": True}


@contextlib.asynccontextmanager
async def holding(client: httpx.AsyncClient) -> AsyncIterator[None]:
    """A batch request that keeps the engine's one slot until the block ends (it is closed, not
    finished: 20000 tokens take minutes)."""
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 20000, "stream": True, "ignore_eos": True}
    async with client.stream("POST", "/v1/completions", json=body, headers=BATCH) as response:
        assert response.status_code == 200
        # One iterator, kept: dropping it part-way would close the connection (and so the request).
        lines = response.aiter_lines()
        while not (await anext(lines)).startswith("data: "):
            pass  # its first token is out: it runs
        yield


async def model_load(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await report(client))["per_model"][MODEL]


async def report(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/load")
    response.raise_for_status()
    return response.json()


async def until_queued(client: httpx.AsyncClient, expected: dict[str, int]) -> dict[str, Any]:
    for _ in range(500):
        load = await model_load(client)
        if load["waiting_tokens_by_tier"] == expected:
            return load
        await asyncio.sleep(0.01)
    raise AssertionError(f"the queue never reached {expected}: {await model_load(client)}")


async def until_idle(client: httpx.AsyncClient) -> None:
    for _ in range(500):
        load = await model_load(client)
        if load["num_running"] == 0 and load["num_waiting"] == 0 and load["kv_blocks_used"] == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the node never went idle: {await model_load(client)}")


async def metrics(client: httpx.AsyncClient) -> str:
    return (await client.get("/metrics")).text


async def refused_total(client: httpx.AsyncClient, tier: str) -> float:
    prefix = f'meridian_node_requests_refused_total{{model="{MODEL}",reason="queue_tokens",tier="{tier}"}} '
    lines = (await metrics(client)).splitlines()
    return next((float(line[len(prefix) :]) for line in lines if line.startswith(prefix)), 0.0)


def assert_overloaded(response: httpx.Response) -> int:
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "overloaded")
    retry_after = int(response.headers["retry-after"])
    assert 1 <= retry_after <= 30
    return retry_after


async def test_a_full_queue_refuses_at_once_with_503_overloaded_and_retry_after_taking_nothing(
    overload_node: Node,
) -> None:
    node = overload_node
    async with httpx.AsyncClient(base_url=node.url, headers=node.headers, timeout=60.0) as client:
        async with holding(client):
            waiting = [
                asyncio.create_task(client.post("/v1/completions", json=completion(i), headers=BATCH))
                for i in range(2)
            ]
            before = await until_queued(client, {"interactive": 0, "batch": 2 * PROMPT})
            refused_before = await refused_total(client, "batch")

            assert_overloaded(await client.post("/v1/completions", json=completion(2), headers=BATCH))
            # A stream is refused the same way: a plain HTTP error before its first byte.
            async with client.stream(
                "POST", "/v1/completions", json=completion(3, stream=True), headers=BATCH
            ) as response:
                await response.aread()
                assert_overloaded(response)

            after = await model_load(client)
            for key in ("waiting_tokens_by_tier", "waiting_tokens", "num_waiting", "num_running"):
                assert after[key] == before[key], key
            assert await refused_total(client, "batch") == refused_before + 2
        # The slot free again, the admitted requests are served.
        assert [(await task).status_code for task in waiting] == [200, 200]
        await until_idle(client)


async def test_interactive_is_admitted_while_batch_is_refused_and_load_reports_the_queue(
    overload_node: Node,
) -> None:
    node = overload_node
    async with httpx.AsyncClient(base_url=node.url, headers=node.headers, timeout=60.0) as client:
        async with holding(client):
            waiting = [
                asyncio.create_task(client.post("/v1/completions", json=completion(i), headers=BATCH))
                for i in range(2)
            ]
            await until_queued(client, {"interactive": 0, "batch": 2 * PROMPT})
            assert_overloaded(await client.post("/v1/completions", json=completion(2), headers=BATCH))
            waiting.append(
                asyncio.create_task(client.post("/v1/completions", json=completion(3), headers=INTERACTIVE))
            )
            load = await until_queued(client, {"interactive": PROMPT, "batch": 2 * PROMPT})
            assert await refused_total(client, "interactive") == 0

            assert load["queue_bound_tokens"] == {"interactive": BOUND, "batch": BOUND}
            assert load["drain_tokens_per_s"] > 0  # the holder decodes
            # A new request waits for the engine's one slot, behind the requests ahead of it (a
            # batch one behind all three, an interactive one behind the interactive one), then
            # for its steps; `queue_wait_s` is the lowest tier's.
            first = load["first_token_s_by_tier"]
            assert 0 < first["interactive"] <= first["batch"] == load["queue_wait_s"]
            whole = await report(client)
            assert whole["queue_wait_s"] > 0
            assert whole["queue_wait_s"] == max(m["queue_wait_s"] for m in whole["per_model"].values())
            text = await metrics(client)
            assert f'meridian_node_queue_waiting_tokens{{model="{MODEL}",tier="batch"}} 80.0' in text
            assert f'meridian_node_queue_bound_tokens{{model="{MODEL}",tier="interactive"}} 100.0' in text
        assert [(await task).status_code for task in waiting] == [200, 200, 200]
        await until_idle(client)

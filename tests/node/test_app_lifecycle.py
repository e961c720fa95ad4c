"""The app in-process with fake engines: readiness during loading, load failures, and failures
after a stream has started (hard to provoke on demand with the real engine)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from litestar.testing import AsyncTestClient

from regional_node.server import NodeConfig, ServedModelConfig, create_app
from tests.node.fakes import FakeLLMEngine, FakeRunner

COMPLETION = {"model": "fake", "prompt": [1, 2, 3], "max_tokens": 4}


def _config() -> NodeConfig:
    return NodeConfig(
        node_id="fake-node", models=[ServedModelConfig(name="fake", path="/nowhere")], warmup=False
    )


def _app(script: str = "ok", loader: Callable[[ServedModelConfig], FakeLLMEngine] | None = None):  # type: ignore[no-untyped-def]
    runners: list[FakeRunner] = []
    load = loader or (lambda _: FakeLLMEngine())

    def load_runner(config: ServedModelConfig) -> FakeRunner:
        runners.append(FakeRunner(load(config), script))
        return runners[-1]

    app = create_app(_config(), loader=load_runner)  # type: ignore[arg-type]
    return app, runners


async def _wait_ready(client: AsyncTestClient, status: int = 200) -> dict:
    for _ in range(200):
        response = await client.get("/ready")
        if response.status_code == status and response.json()["status"] != "loading":
            return response.json()
        await asyncio.sleep(0.01)
    raise AssertionError("never left loading")


async def test_health_answers_and_ready_is_503_while_models_load() -> None:
    release = threading.Event()

    def slow_loader(_: ServedModelConfig) -> FakeLLMEngine:
        release.wait(10)
        return FakeLLMEngine()

    app, _ = _app(loader=slow_loader)
    async with AsyncTestClient(app) as client:
        assert (await client.get("/health")).status_code == 200
        loading = await client.get("/ready")
        assert loading.status_code == 503 and loading.json()["status"] == "loading"
        early = await client.post("/v1/completions", json=COMPLETION)
        assert early.status_code == 503 and early.json()["error"]["code"] == "model_loading"
        release.set()
        assert (await _wait_ready(client))["status"] == "ready"


async def test_failed_load_keeps_ready_503_with_the_reason() -> None:
    def broken_loader(_: ServedModelConfig) -> FakeLLMEngine:
        raise RuntimeError("weights are corrupt")

    app, _ = _app(loader=broken_loader)
    async with AsyncTestClient(app) as client:
        body = await _wait_ready(client, status=503)
        assert body["status"] == "failed" and "weights are corrupt" in body["error"]
        assert (await client.get("/health")).status_code == 200


async def test_failure_after_stream_start_is_an_error_event_then_done() -> None:
    app, _ = _app(script="fail_mid")
    async with AsyncTestClient(app) as client:
        await _wait_ready(client)
        response = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
        assert response.status_code == 200
        events = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2] and "the model step failed" in events[-2]
    assert not any('"finish_reason":"length"' in event for event in events)


async def test_engine_abort_is_never_a_successful_response() -> None:
    app, _ = _app(script="abort")
    async with AsyncTestClient(app) as client:
        await _wait_ready(client)
        whole = await client.post("/v1/completions", json=COMPLETION)
        assert whole.status_code == 503 and whole.json()["error"]["code"] == "request_aborted"
        streamed = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
        events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and "request_aborted" in events[-2]


async def test_shutdown_stops_every_engine() -> None:
    app, runners = _app()
    async with AsyncTestClient(app) as client:
        await _wait_ready(client)
        assert runners[0].started
    assert runners[0].stopped

"""Operations on a real node (issue 34). Golden-output probes: `meridian model certify` writes the
golden file next to a checkpoint; a node serving other weights under the same name and version
never becomes ready for that model, and says so in /ready, /load and /metrics, while its
certified model serves. Queue age per tier, utilization per phase, and histograms from the start.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from regional_node.probes import GOLDEN_FILE, read_golden
from tests.support.checkpoints import endless_checkpoint, make_checkpoint
from tests.support.processes import free_port, python_command, start_process

pytestmark = pytest.mark.slow

TOKEN = "probe-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def certify(checkpoint: Path) -> None:
    result = subprocess.run(
        python_command("-m", "meridian.cli", "model", "certify", str(checkpoint)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "certified" in result.stdout


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    checkpoint = make_checkpoint(tmp_path_factory.mktemp("certified"), "qwen2", "tiny")
    certify(checkpoint)
    return checkpoint


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_certify_writes_golden_file_next_to_checkpoint(certified: Path) -> None:
    golden = read_golden(certified / GOLDEN_FILE)
    assert golden.dtype == "float32" and golden.cases
    assert all(case.token_ids and len(case.token_ids) == len(case.logprobs) for case in golden.cases)


@pytest.fixture(scope="module")
def node(certified: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("node")
    # Other weights (another seed) carrying the certified version's golden file: what a bad copy,
    # a wrong upload or corrupted storage looks like to a node.
    impostor = make_checkpoint(folder, "qwen2", "tiny", seed=1)
    shutil.copy(certified / GOLDEN_FILE, impostor / GOLDEN_FILE)
    port = free_port()
    config = folder / "node.yaml"
    probes = "{interval_s: 0.3, max_share: 1.0}"
    config.write_text(
        f"""
node_id: probe-node
port: {port}
models:
  - {{name: good, path: {certified}, version: v1, probes: {probes}}}
  - {{name: bad, path: {impostor}, version: v1, probes: {probes}}}
  - {{name: one-slot, path: {endless_checkpoint(folder)}, engine: {{max_num_seqs: 1}}}}
""",
        encoding="utf-8",
    )
    url = f"http://127.0.0.1:{port}"
    with start_process(
        python_command("-m", "regional_node", "node", "--config", str(config), "--log-level", "warning"),
        env={"MERIDIAN_NODE_TOKEN": TOKEN},
        ready_url=f"{url}/ready?model=good",
        ready_headers=AUTH,
        timeout=120,
    ):
        yield url


def test_histograms_exist_before_the_first_request(node: str) -> None:
    # Before any client request (the probes go to the engine, not through the HTTP layer).
    found = samples(httpx.get(f"{node}/metrics", headers=AUTH, timeout=10).text)
    for model in ("good", "bad"):
        for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
            assert found[(f"{name}_count", (("engine", "0"), ("model_name", model)))] == 0
        assert found[("meridian_node_time_to_first_token_seconds_count", (("model", model),))] == 0


def test_impostor_weights_never_become_ready(node: str) -> None:
    with httpx.Client(base_url=node, headers=AUTH, timeout=30) as http:
        ready = http.get("/ready")
        assert ready.status_code == 200, ready.text  # the node serves its certified model
        assert ready.json()["failing"] == ["bad"]
        assert ready.json()["probes"] == {"good": "passed", "bad": "failed", "one-slot": "none"}
        assert http.get("/ready", params={"model": "bad"}).status_code == 503
        assert http.get("/ready", params={"model": "good"}).status_code == 200

        load = http.get("/load").json()["per_model"]
        assert (load["bad"]["probe"], load["good"]["probe"]) == ("failed", "passed")
        assert load["good"]["probe_last_success"] is not None and load["bad"]["probe_last_success"] is None

        body = {"model": "bad", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        refused = http.post("/v1/chat/completions", json=body)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "model_probe_failed"
        assert http.post("/v1/chat/completions", json={**body, "model": "good"}).status_code == 200

        # The schedule keeps probing, and keeps failing it: it never becomes ready.
        deadline = time.monotonic() + 60
        while True:
            found = samples(http.get("/metrics").text)
            if found[("meridian_node_probe_failures_total", (("model", "bad"),))] >= 3:
                break
            assert time.monotonic() < deadline, "the scheduled probes did not run"
            time.sleep(0.2)
        assert http.get("/ready", params={"model": "bad"}).status_code == 503
        assert found[("meridian_node_probe_failures_total", (("model", "good"),))] == 0
        assert found[("meridian_node_probe_passing", (("model", "bad"),))] == 0
        assert found[("meridian_node_probe_passing", (("model", "good"),))] == 1
        assert found[("meridian_node_probe_last_success_timestamp_seconds", (("model", "good"),))] > 0
        assert ("meridian_node_probe_last_success_timestamp_seconds", (("model", "bad"),)) not in found


def test_queue_age_and_utilization_are_exported(node: str) -> None:
    found = samples(httpx.get(f"{node}/metrics", headers=AUTH, timeout=10).text)
    for tier in ("interactive", "batch"):
        assert ("meridian_node_queue_age_seconds", (("model", "good"), ("tier", tier))) in found
    # The probes' steps ran in the last minute: prefill and decode utilization are measured.
    for phase in ("prefill", "decode"):
        key = (("model", "good"), ("phase", phase))
        assert 0 < found[("meridian_node_model_flops_utilization", key)] < 1
        assert 0 < found[("meridian_node_memory_bandwidth_utilization", key)]
        assert found[("meridian_node_phase_tokens_total", key)] > 0
    assert found[("meridian_node_peak_flops_per_second", (("model", "good"), ("source", "measured")))] > 0


async def test_queue_age_grows_while_a_request_waits(node: str) -> None:
    import asyncio

    import openai

    sdk = openai.AsyncOpenAI(base_url=f"{node}/v1", api_key=TOKEN, max_retries=0, timeout=120)
    ask = {"model": "one-slot", "messages": [{"role": "user", "content": "go"}], "max_tokens": 4000}
    async with sdk:
        # The one slot is taken by a reply that never ends of itself; the next request waits.
        holder = await sdk.chat.completions.create(**ask, stream=True)
        await anext(aiter(holder))
        waiter = asyncio.create_task(sdk.chat.completions.create(**{**ask, "max_tokens": 1}))
        try:
            async with httpx.AsyncClient(base_url=node, headers=AUTH, timeout=10) as http:
                ages: list[float] = []
                deadline = time.monotonic() + 60
                while len(ages) < 2 or ages[-1] <= ages[0]:
                    load = (await http.get("/load")).json()
                    age = load["per_model"]["one-slot"]["queue_age_s_by_tier"].get("interactive")
                    if age is not None:
                        ages.append(age)
                    assert time.monotonic() < deadline, f"no growing queue age: {ages}"
                    await asyncio.sleep(0.1)
                assert load["queue_age_s_by_tier"]["interactive"] >= age
                assert "batch" not in load["per_model"]["one-slot"]["queue_age_s_by_tier"]
                found = samples((await http.get("/metrics")).text)
                key = (("model", "one-slot"), ("tier", "interactive"))
                assert found[("meridian_node_queue_age_seconds", key)] >= age
                assert (
                    found[("meridian_node_queue_age_seconds", (("model", "one-slot"), ("tier", "batch")))]
                    == 0
                )
        finally:
            await holder.close()
            waiter.cancel()
            with contextlib.suppress(BaseException):
                await waiter

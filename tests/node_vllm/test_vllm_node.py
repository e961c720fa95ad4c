"""A node with `engine: vllm` serves exactly the node API of one on our engine: the OpenAI SDK
(streamed and not), auth, /load fed by vLLM's stats, client disconnect → abort, tenant cache salts,
and a greedy stream broken on one engine continues on the other with identical tokens and text."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from regional_node.cpu_share import available_cpus, child_processes, default_engine_cpus
from tests.node.conftest import Node
from tests.node_vllm.conftest import MODEL, needs_vllm

pytestmark = needs_vllm

GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"return_token_ids": True, "ignore_eos": True}}
PROMPT = "Far across the sea"
# Tokens: far more than vLLM generates in the seconds these tests wait (within conftest's MAX_MODEL_LEN).
LONG = 30000
# Deadlines for conditions a loaded 2-core machine reaches in seconds: generous, never a speed.
DEADLINE_S = 120.0


def completion(node: Node, max_tokens: int = 24, **extra: Any) -> tuple[list[int], str, str]:
    with node.client() as client:
        response = client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=max_tokens,
            temperature=0,
            extra_body={"return_token_ids": True, "ignore_eos": True, **extra},
        )
    choice = response.choices[0]
    return choice.model_extra["token_ids"], choice.text, choice.finish_reason


def stream_chat(
    node: Node, max_tokens: int, headers: dict[str, str] | None = None, **extra: Any
) -> tuple[list[tuple[list[int], str]], str | None]:
    """(token ids, text) per content chunk, and the finish reason."""
    chunks: list[tuple[list[int], str]] = []
    finish = None
    with node.client() as client:
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell a story"}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_headers=headers,
            extra_body={"return_token_ids": True, "ignore_eos": True, **extra},
        ):
            for choice in chunk.choices:
                ids = (choice.model_extra or {}).get("token_ids") or []
                if ids or choice.delta.content:
                    chunks.append((ids, choice.delta.content or ""))
                finish = choice.finish_reason or finish
    return chunks, finish


def test_sdk_completion_gives_our_engines_greedy_tokens_and_text(vllm_node: Node, our_node: Node) -> None:
    ids, text, finish = completion(vllm_node)
    assert (ids, text, finish) == completion(our_node)
    assert len(ids) == 24 and finish == "length"


def test_sdk_stream_gives_our_engines_chunks(vllm_node: Node, our_node: Node) -> None:
    chunks, finish = stream_chat(vllm_node, 20)
    assert finish == "length" and sum(len(ids) for ids, _ in chunks) == 20
    ours, our_finish = stream_chat(our_node, 20)
    assert our_finish == finish
    assert [t for ids, _ in chunks for t in ids] == [t for ids, _ in ours for t in ids]
    assert "".join(text for _, text in chunks) == "".join(text for _, text in ours)


def test_stop_strings_logprobs_and_usage(vllm_node: Node, our_node: Node) -> None:
    _, text, _ = completion(our_node)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    with vllm_node.client() as client:
        response = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=1, stop=[stop]
        )
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and text.startswith(choice.text) and stop not in choice.text
    assert choice.model_extra["stop_reason"] == stop
    assert choice.logprobs is not None and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert response.usage.completion_tokens == len(choice.logprobs.token_logprobs)


def test_top_logprobs_are_our_engines(vllm_node: Node, our_node: Node) -> None:
    """Each token's alternatives from vLLM (its processed logprobs' top k) are the ones our engine
    lists: as many, most likely first, the chosen token first (greedy), the same values."""

    def alternatives(node: Node) -> list[list[tuple[str, float]]]:
        with node.client() as client:
            reply = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell a story"}],
                max_tokens=12,
                temperature=0,
                logprobs=True,
                top_logprobs=4,
                extra_body={"ignore_eos": True},
            )
        content = reply.choices[0].logprobs.content
        for entry in content:
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        return [[(a.token, a.logprob) for a in entry.top_logprobs] for entry in content]

    theirs, ours = alternatives(vllm_node), alternatives(our_node)
    assert len(theirs) == len(ours) == 12
    for their_top, our_top in zip(theirs, ours, strict=True):
        assert len(their_top) == len(our_top) == 4
        assert [v for _, v in their_top] == pytest.approx([v for _, v in our_top], abs=2e-3)
        values = [v for _, v in their_top]
        assert values == sorted(values, reverse=True)


def test_stop_reason_is_our_engines(vllm_node: Node, our_node: Node) -> None:
    """The stop string or stop token id that ended a choice (vLLM's `stop_reason`), null when the
    length did; on a stream, the finishing chunk carries it."""
    ids, _, _ = completion(our_node)
    stop_token = ids[10]
    story = "".join(text for _, text in stream_chat(our_node, 24)[0])
    stop = story[len(story) // 2 : len(story) // 2 + 3]

    def stop_reasons(node: Node) -> list[tuple[str | None, Any]]:
        with node.client() as client:
            by_length, by_token = (
                client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=extra
                ).choices[0]
                for extra in ({"ignore_eos": True}, {"ignore_eos": True, "stop_token_ids": [stop_token]})
            )
            chunks = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell a story"}],
                max_tokens=24,
                temperature=0,
                stop=[stop],
                stream=True,
                extra_body={"ignore_eos": True},
            )
            finishing = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
        return [(c.finish_reason, c.model_extra["stop_reason"]) for c in (by_length, by_token, *finishing)]

    assert stop_reasons(vllm_node) == [("length", None), ("stop", stop_token), ("stop", stop)]
    assert stop_reasons(our_node) == [("length", None), ("stop", stop_token), ("stop", stop)]


def test_a_seeded_sample_repeats_on_the_vllm_node(vllm_node: Node) -> None:
    def sample() -> str:
        with vllm_node.client() as client:
            return (
                client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=1234
                )
                .choices[0]
                .text
            )

    assert sample() == sample()


@pytest.mark.parametrize("direction", ["ours then vllm", "vllm then ours"])
def test_a_stream_broken_on_one_engine_continues_on_the_other(
    vllm_node: Node, our_node: Node, direction: str
) -> None:
    first, second = (our_node, vllm_node) if direction == "ours then vllm" else (vllm_node, our_node)
    whole, finish = stream_chat(first, 24)
    for k in (1, 7, len(whole) - 1):
        carried = [t for ids, _ in whole[:k] for t in ids]
        rest, rest_finish = stream_chat(second, 24 - len(carried), continuation_token_ids=carried)
        assert [t for ids, _ in whole[:k] + rest for t in ids] == [t for ids, _ in whole for t in ids]
        assert "".join(text for _, text in whole[:k] + rest) == "".join(text for _, text in whole)
        assert rest_finish == finish == "length"


def test_cache_salt_isolates_tenants_prefix_cache(vllm_node: Node) -> None:
    """Same long prompt: reused within one tenant's salt, never across salts."""
    prompt = "paged attention with block tables and prefix caching " * 8

    def cached(salt: str) -> int:
        with vllm_node.client() as client:
            response = client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=2,
                temperature=0,
                extra_headers={"x-meridian-cache-salt": salt},
            )
        return response.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0
    assert cached("tenant-a") > 0


def test_auth_health_and_unknown_model(vllm_node: Node) -> None:
    assert httpx.get(f"{vllm_node.url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{vllm_node.url}/ready", timeout=5).status_code == 401
    with openai.OpenAI(base_url=f"{vllm_node.url}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    with vllm_node.client() as client, pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi", max_tokens=2)


def test_vllms_processes_compute_in_the_engines_share_and_the_api_does_not(vllm_node: Node) -> None:
    """The default share (server README, "CPU share"): vLLM's engine core and worker run on every
    core but the last and 10 levels nicer than the node, whose own process stays as it was."""
    node_pid = vllm_node.process.process.pid
    engine = child_processes(node_pid)
    assert engine, "vLLM's engine processes are the node's children"
    base = os.getpriority(os.PRIO_PROCESS, node_pid)
    cores = default_engine_cpus(available_cpus())
    for pid in engine:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                assert os.sched_getaffinity(int(tid)) <= cores
                assert os.getpriority(os.PRIO_PROCESS, int(tid)) == min(base + 10, 19)
    assert os.sched_getaffinity(node_pid) == available_cpus()


@pytest.mark.slow
def test_a_request_arriving_while_the_engine_is_saturated_is_queued_and_served(vllm_node: Node) -> None:
    """No 408 from the HTTP server and no starved API: with every engine core busy, /load answers
    and a new request (streamed or not) is read at once, queued in vLLM and served."""
    with httpx.Client(base_url=vllm_node.url, headers=vllm_node.headers, timeout=DEADLINE_S) as http:
        with contextlib.ExitStack() as streams:
            for i in range(3):
                streams.enter_context(_running_stream(http, f"busy {i} {PROMPT}"))
            load = http.get("/load")
            assert load.status_code == 200 and load.json()["num_running"] >= 3
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}
            response = http.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["finish_reason"] == "length"
            with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
                assert stream.status_code == 200
                events = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"


def test_load_moves_under_load_and_returns_to_idle(vllm_node: Node) -> None:
    def busy(load: dict[str, Any]) -> bool:
        return load["num_running"] > 0 and load["kv_blocks_used"] > 0

    # Long streams, held open while /load is polled.
    with httpx.Client(base_url=vllm_node.url, headers=vllm_node.headers, timeout=DEADLINE_S) as http:
        with contextlib.ExitStack() as streams:
            for i in range(3):
                streams.enter_context(_running_stream(http, f"{i} {PROMPT}"))
            loaded = _wait_for(vllm_node, busy)
    model = loaded["per_model"][MODEL]
    assert 0 < model["kv_cache_usage"] <= 1 and model["kv_blocks_total"] > 0
    idle = _wait_for(vllm_node, lambda load: load["num_running"] == 0 and load["kv_blocks_used"] == 0)
    assert idle["per_model"][MODEL]["drain_tokens_per_s"] >= 0
    # Every request left the waiting set on its first output: no queue age is left behind.
    assert idle["per_model"][MODEL]["queue_age_s_by_tier"] == {}


def test_client_disconnect_aborts_the_vllm_request(vllm_node: Node) -> None:
    generated_before = _generated_tokens(vllm_node)
    with httpx.Client(base_url=vllm_node.url, headers=vllm_node.headers, timeout=DEADLINE_S) as http:
        with _running_stream(http, PROMPT):
            _wait_for(vllm_node, lambda load: load["num_running"] >= 1)
    idle = _wait_for(vllm_node, lambda load: load["num_running"] == 0 and load["kv_blocks_used"] == 0)
    assert idle["num_waiting"] == 0
    metrics = httpx.get(f"{vllm_node.url}/metrics", headers=vllm_node.headers, timeout=DEADLINE_S).text
    assert 'outcome="disconnected"' in metrics
    # Aborted, not run to its end and then found idle.
    assert _generated_tokens(vllm_node) - generated_before < LONG


@contextlib.contextmanager
def _running_stream(http: httpx.Client, prompt: str) -> Iterator[None]:
    """A stream of LONG tokens, open (and its request running in vLLM: it has sent its first
    token) until the block ends; closing it is a client disconnect."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": LONG, "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        yield


def _generated_tokens(node: Node) -> float:
    metrics = httpx.get(f"{node.url}/metrics", headers=node.headers, timeout=DEADLINE_S).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "vllm:generation_tokens"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def _wait_for(node: Node, condition: Any) -> dict[str, Any]:
    """/load once `condition` holds of it; each call and the whole wait bounded by DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=node.url, headers=node.headers, timeout=DEADLINE_S) as http:
        load = http.get("/load").raise_for_status().json()
        while not condition(load) and time.monotonic() < deadline:
            time.sleep(0.1)
            load = http.get("/load").raise_for_status().json()
    assert condition(load), json.dumps(load)  # the whole of it: pytest's repr elides keys
    return load


def test_tokenize_counts_the_prompt_the_vllm_engine_is_given(vllm_node: Node) -> None:
    """`/tokenize` (the gateway's token counts) on a vLLM-engine node: the count is the prompt
    tokens its chat generation reports, as on our engine."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell a story"}]
    with vllm_node.http() as http:
        counted = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
    with vllm_node.client() as client:
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert reply.usage is not None and counted["count"] == reply.usage.prompt_tokens > 0

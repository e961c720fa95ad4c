"""A stream continued on another node after its first one broke is still held back and checked:
the blocked span, generated only after the continuation, never reaches the client.

One real node behind two cutting TCP proxies (tests/gateway/test_exact_continuation.py): the
first stream is cut after a few SSE events, as a node SIGKILLed mid-stream looks to the gateway,
and continues token-exactly through the other proxy."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.gateway.conftest import RunningGateway, gateway_config, run_gateway, running_fleet
from tests.gateway.test_exact_continuation import Cuts, proxies
from tests.safety.conftest import sse_events, streamed_text, write_policies

pytestmark = pytest.mark.slow

MODEL = "meridian-small"
PLAIN, OUT = "sk-plain", "sk-out"
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
    "max_tokens": 100,
    "temperature": 0,
    "ignore_eos": True,
}


def policy(pattern: str) -> dict[str, object]:
    return {"input": [], "output": ["blocklist"], "blocklist": [{"regex": pattern, "action": "block"}]}


@pytest.fixture(scope="module")
def setup(
    llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, Cuts, Path]]:
    work = tmp_path_factory.mktemp("safety-continuation")
    cuts = Cuts()
    with (
        running_fleet([("node-1", "eu-west", "eu")], {MODEL: (llama_checkpoint, "small")}, work) as [node],
        proxies(node.port, cuts, 2) as (first, second),
    ):
        regions = work / "regions.yaml"
        entries = [
            {"node_id": name, "url": f"http://127.0.0.1:{proxy.port}", "region": "eu-west"}
            | {"jurisdiction": "eu", "models": [MODEL]}
            for name, proxy in (("node-a", first), ("node-b", second))
        ]
        regions.write_text(yaml.safe_dump({"nodes": entries}), encoding="utf-8")
        policies = write_policies(work / "policies", {"plain": (PLAIN, None), "out": (OUT, policy("zzz"))})
        config = gateway_config(
            regions,
            policies=str(policies),
            catalog=[{"name": MODEL, "tier": "small"}],
            ejection={"base_s": 0.05, "max_s": 0.1},
        )
        config["timeouts"] |= {"probe_interval_s": 0.1}
        with run_gateway(config, tenants=()) as gw:
            yield gw, cuts, policies


def stream(gw: RunningGateway, key: str) -> list[dict[str, object]]:
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json={**BODY, "stream": True},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    ) as response:
        assert response.status_code == 200, response.read()
        return sse_events(response)


def healthy(gw: RunningGateway) -> None:
    deadline = time.monotonic() + 10
    while httpx.get(gw.url + "/health").json()["healthy_nodes"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_continued_stream_is_still_checked_and_blocked(setup: tuple[RunningGateway, Cuts, Path]) -> None:
    gw, cuts, policies = setup
    healthy(gw)
    text = streamed_text(stream(gw, PLAIN))
    assert len(text) > 160, text
    span = text[140:152]  # generated long after the cut below
    write_policies(policies, {"plain": (PLAIN, None), "out": (OUT, policy(re.escape(span)))})
    deadline = time.monotonic() + 15
    while gw.gateway.policies.current().safety_for("out").blocklist[0].entry.pattern.pattern == "zzz":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the new policy was not picked up"
        time.sleep(0.1)
    healthy(gw)
    continued = gw.metric("meridian_gateway_failovers_total", kind="continuation")
    cuts.arm(4)  # the first node's stream breaks after 4 events (the role and 3 tokens)
    events = stream(gw, OUT)
    assert cuts.pending == 0
    assert gw.metric("meridian_gateway_failovers_total", kind="continuation") == continued + 1
    got = streamed_text(events)
    assert got and span not in got and text.startswith(got[:20])
    finishes = [c["finish_reason"] for e in events for c in e.get("choices") or [] if c.get("finish_reason")]  # type: ignore[union-attr]
    assert finishes == ["content_filter"]

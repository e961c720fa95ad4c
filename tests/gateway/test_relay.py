"""The stream relay's bookkeeping, with scripted upstream streams (the real-node version of
these drills is in test_resilience.py): what a continuation asks for, and what the client sees."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import pytest

from gateway.config import RetryConfig
from gateway.health import BreakerBoard, ejection
from gateway.metrics import GatewayMetrics
from gateway.request.plan import RequestPlan
from gateway.streaming.relay import StreamRelay
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import BodyFor, Forwarder, OpenedStream
from protocol import ServiceUnavailableError
from router.types import CatalogModel, Target

NODE_A = Target("node", "a", "http://a", "eu-west", "eu", "m", "first")
NODE_B = Target("node", "b", "http://b", "eu-west", "eu", "m", "second")


def chunk(
    ids: list[int] | None = None, text: str = "", finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": extra.get("id", "c1"), "created": 1, "model": "m", "choices": [choice]}


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "id": "x",
        "created": 2,
        "model": "m",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def opened(target: Target, script: list[dict[str, Any] | Exception]) -> OpenedStream:
    async def chunks() -> AsyncIterator[dict[str, Any]]:
        for item in script[1:]:
            if isinstance(item, Exception):
                raise item
            yield item

    first = script[0]
    assert isinstance(first, dict)
    return OpenedStream(target=target, attempts=1, chunks=chunks(), first=first, stack=AsyncExitStack())


def plan(*, max_tokens: int = 10, wants_token_ids: bool = False, include_usage: bool = True) -> RequestPlan:
    return RequestPlan(
        endpoint="chat",
        model=CatalogModel("m", "small"),
        base_body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        stream=True,
        max_tokens=max_tokens,
        prompt_tokens_estimate=5,
        estimated_tokens=15,
        include_usage=include_usage,
        wants_token_ids=wants_token_ids,
        affinity_key="",
        n=1,
    )


class FakeFleet:
    board = BreakerBoard(ejection(base_s=1.0, max_s=2.0))


def relay(first: OpenedStream, reopen: Any, request_plan: RequestPlan) -> StreamRelay:
    metrics = GatewayMetrics()
    forwarder = Forwarder(FakeFleet(), metrics, retry=RetryConfig(), stream_idle_s=5.0)  # type: ignore[arg-type]
    return StreamRelay(
        first,
        plan=request_plan,
        forwarder=forwarder,
        metrics=metrics,
        reopen=reopen,
        idle_s=5.0,
        max_continuations=2,
    )


async def collect(r: StreamRelay) -> list[dict[str, Any]]:
    return [c async for c in r.chunks()]


async def test_continuation_resends_tokens_whose_text_was_held_back() -> None:
    broken = UpstreamError("connection reset", status_code=502)
    # Tokens 2 and 3 form one character: the first node sent their ids but not yet their text.
    first = opened(NODE_A, [chunk([], "", id="c1"), chunk([1], "a"), chunk([2], ""), chunk([3], ""), broken])
    asked: dict[str, Any] = {}

    async def reopen(exclude: frozenset[str], model: str, body_for: BodyFor) -> OpenedStream:
        asked.update(exclude=exclude, model=model, body=body_for(NODE_B))
        return opened(
            NODE_B,
            [
                chunk([], "", id="c2"),
                chunk([2], ""),
                chunk([3], "€"),
                chunk([4], "b"),
                chunk([], "", "length"),
                usage(6, 3),
            ],
        )

    r = relay(first, reopen, plan(max_tokens=10, wants_token_ids=True))
    out = await collect(r)
    assert asked["exclude"] == frozenset({"a"}) and asked["model"] == "m"
    assert asked["body"]["continuation_token_ids"] == [1]
    assert asked["body"]["max_tokens"] == 9
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in out if c.get("choices"))
    assert text == "a€b"
    ids = [t for c in out for choice in c.get("choices", []) for t in choice.get("token_ids") or []]
    assert ids == [1, 2, 3, 4]
    assert {c["id"] for c in out} == {"c1"}, "one stream id for the client"
    assert out[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert r.error is None


async def test_token_ids_are_stripped_unless_asked_for() -> None:
    first = opened(NODE_A, [chunk([], ""), chunk([1], "a"), chunk([], "", "stop"), usage(5, 1)])
    out = await collect(relay(first, None, plan(include_usage=False)))
    assert all("token_ids" not in choice for c in out for choice in c["choices"])
    assert all("usage" not in c for c in out)


async def test_a_break_that_cannot_be_continued_ends_with_an_error_event() -> None:
    first = opened(NODE_A, [chunk([], ""), chunk([1], "a"), UpstreamError("reset", status_code=502)])

    async def reopen(exclude: frozenset[str], model: str, body_for: BodyFor) -> OpenedStream:
        raise ServiceUnavailableError("no other healthy node serving 'm'")

    r = relay(first, reopen, plan())
    out = await collect(r)
    assert out[-1]["error"]["code"] == "stream_interrupted"
    assert "no other healthy node" in out[-1]["error"]["message"]
    assert r.error is not None


@pytest.mark.parametrize("script_end", [[chunk([], "", "stop")], [chunk([2], "b")]])
async def test_a_break_after_the_last_token_needs_no_continuation(script_end: list[dict[str, Any]]) -> None:
    # Either the finish chunk arrived (only usage was lost), or max_tokens were all sent.
    first = opened(
        NODE_A, [chunk([], ""), chunk([1], "a"), *script_end, UpstreamError("reset", status_code=502)]
    )

    async def reopen(exclude: frozenset[str], model: str, body_for: BodyFor) -> OpenedStream:
        raise AssertionError("no continuation needed")

    out = await collect(relay(first, reopen, plan(max_tokens=2)))
    assert "error" not in out[-1]
    assert [c for c in out if c.get("choices") and c["choices"][0].get("finish_reason")]

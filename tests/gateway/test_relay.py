"""Streams that break midway, with scripted upstream streams (the real-node version of these drills
is in test_resilience.py): what the relay reports, what the continuation rule decides, what a
continuation asks for, and what the client sees. The loop under test is the real pipeline's."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from typing import Any

import msgspec
import pytest

from gateway.call.continuation import Continue, Stop, StreamBreak, decide
from gateway.call.errors import NoRouteError
from gateway.call.pipeline import RequestPipeline
from gateway.call.plan import RequestPlan
from gateway.config import config_from_dict
from gateway.metrics import GatewayMetrics
from gateway.observe import Ended, QuietCall
from gateway.policy import PolicyStore, key_digest
from gateway.quota import QuotaConfig, build_quota_gate
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import OpenedStream
from protocol import ChatCompletionRequest
from protocol.chunk import OPENED_USAGE_FIELD, Chunk, chunk_from
from router.types import CatalogModel, FleetSnapshot, NodeInfo, Prefill, Target, TenantPolicy
from tests.support.chunks import as_wire

NODE_A = Target("node", "a", "http://a", "eu-west", "eu", "m", "first")
NODE_B = Target("node", "b", "http://b", "eu-west", "eu", "m", "second")
KEY = "sk-relay"


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


Script = list[dict[str, Any] | Exception]


def opened(target: Target, script: Script) -> OpenedStream:
    async def chunks() -> AsyncIterator[Chunk]:
        for item in script[1:]:
            if isinstance(item, Exception):
                raise item
            yield chunk_from(item)

    first = script[0]
    assert isinstance(first, dict)
    return OpenedStream(
        target=target, attempts=1, chunks=chunks(), first=chunk_from(first), stack=AsyncExitStack()
    )


class _NodeUpstream:
    token_exact = True


class ScriptedFleet:
    """Nodes a and b, both healthy, serving model m."""

    def snapshot(self) -> FleetSnapshot:
        nodes = tuple(
            NodeInfo(t.target_id, t.url, t.region, t.jurisdiction, frozenset({"m"})) for t in (NODE_A, NODE_B)
        )
        return FleetSnapshot(nodes=nodes)

    def route_label(self, target: Target) -> str:
        return target.reason

    def routed(self, target: Target, prefill: Prefill, request_id: str) -> None:
        """The scripted nodes publish nothing and are never probed: no overlay to keep."""

    def answered(self, request_id: str, routed: Target, served: Target | None, *, ended: bool) -> None:
        """No overlay: nothing to update."""

    def ended(self, request_id: str, target: Target) -> None:
        """No overlay: nothing to update."""

    def upstream_for(self, target: Target) -> _NodeUpstream:
        return _NodeUpstream()


class ScriptedFailover:
    """Opens the scripted streams in turn; an exception in `streams` is raised by that open."""

    def __init__(self, streams: Sequence[OpenedStream | Exception]) -> None:
        self.streams = list(streams)
        self.asked: list[dict[str, Any]] = []  # for each continuation: targets offered and body
        self.broken: list[str] = []

    async def open_stream(
        self,
        targets: Sequence[Target],
        endpoint: str,
        body: dict[str, Any],
        headers: dict[str, str],
        scope: Any = None,
    ) -> OpenedStream:
        if self.asked or self.broken:  # not the first open: a continuation
            # What the forwarder sends the first target: the body, asking for its model.
            asked = {**body, "model": targets[0].model}
            self.asked.append({"targets": [t.target_id for t in targets], "body": asked})
        item = self.streams.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def record_failure(self, target: Target, error: UpstreamError, *, outcome: str | None = None) -> None:
        self.broken.append(f"{target.target_id}:{outcome}")


def pipeline(failover: ScriptedFailover, told: Told) -> RequestPipeline:
    config = config_from_dict(
        {
            "home_region": "eu-west",
            "catalog": [{"name": "m", "tier": "small"}],
            "policies": ".",
            "directory": {"type": "static", "file": "regions.yaml"},
        }
    )
    tenant = TenantPolicy(tenant_id="t", api_key_hashes=frozenset({key_digest(KEY)}))
    policies = PolicyStore(None, extra=(tenant,))
    policies.load()
    return RequestPipeline(
        config=config,
        policies=policies,
        quota=build_quota_gate(QuotaConfig()),
        fleet=ScriptedFleet(),  # type: ignore[arg-type]
        forwarder=failover,  # type: ignore[arg-type]
        metrics=GatewayMetrics(),
        observer=told,
    )


class Told(QuietCall):
    """An observer that keeps how each call ended, as the observers are told it."""

    def __init__(self) -> None:
        self.ended_with: list[Ended] = []

    def start(self, headers: Any, request_id: str) -> Told:
        return self

    def ended(self, ended: Ended) -> None:
        self.ended_with.append(ended)


async def stream(
    streams: Sequence[OpenedStream | Exception], *, max_tokens: int = 10, **fields: Any
) -> tuple[list[dict[str, Any]], ScriptedFailover, Ended]:
    """The client's chunks, the failover's record, and how the call's observers were told it ended."""
    failover = ScriptedFailover(streams)
    told = Told()
    p = pipeline(failover, told)
    ctx = p.start_call({})
    p.authenticate(ctx, f"Bearer {KEY}")
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    body.update(fields)
    request = msgspec.convert(body, ChatCompletionRequest)
    served = await p.stream(ctx, "chat", request, body)
    try:
        out = [as_wire(c) async for c in served.items()]
    finally:
        await served.aclose()
    [ended] = told.ended_with
    return out, failover, ended


async def test_a_continuation_carries_every_token_sent_and_the_next_node_emits_their_held_back_text() -> None:
    broken = UpstreamError("connection reset", status_code=502)
    # Tokens 2 and 3 form one character: the first node sent their ids but not yet their text.
    first = opened(NODE_A, [chunk([], "", id="c1"), chunk([1], "a"), chunk([2], ""), chunk([3], ""), broken])
    # The next node replays 1, 2, 3 as the first did, so the held-back text comes with token 4.
    second = opened(NODE_B, [chunk([], "", id="c2"), chunk([4], "€b"), chunk([], "", "length"), usage(8, 1)])
    out, failover, ended = await stream(
        [first, second], return_token_ids=True, stream_options={"include_usage": True}
    )
    assert failover.broken == ["a:broken"]
    [asked] = failover.asked
    assert asked["targets"] == ["b"], "the broken node is excluded, and the same model is asked for"
    assert asked["body"]["model"] == "m"
    assert asked["body"]["continuation_token_ids"] == [1, 2, 3]
    assert asked["body"]["max_tokens"] == 7
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in out if c.get("choices"))
    assert text == "a€b"
    ids = [t for c in out for choice in c.get("choices", []) for t in choice.get("token_ids") or []]
    assert ids == [1, 2, 3, 4]
    assert {c["id"] for c in out} == {"c1"}, "one stream id for the client"
    assert out[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert ended.stream_error is None and ended.status == "200"


async def test_a_node_stream_that_ends_without_its_finish_is_continued_not_passed_off_as_done() -> None:
    # The node's stream just ends ([DONE] or EOF, no error) before any finish_reason: a break.
    first = opened(NODE_A, [chunk([], "", id="c1"), chunk([1], "a"), chunk([2], "b")])
    second = opened(NODE_B, [chunk([], "", id="c2"), chunk([3], "c"), chunk([], "", "stop")])
    out, failover, ended = await stream([first, second], return_token_ids=True)
    assert failover.broken == ["a:broken"]
    [asked] = failover.asked
    assert asked["body"]["continuation_token_ids"] == [1, 2]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in out if c.get("choices"))
    assert text == "abc"
    assert [c["choices"][0]["finish_reason"] for c in out if c.get("choices")][-1] == "stop"
    assert ended.stream_error is None and ended.status == "200"


async def test_a_stream_without_its_finish_that_cannot_be_continued_ends_with_an_error() -> None:
    first = opened(NODE_A, [chunk([], ""), chunk([1], "a")])
    out, _, ended = await stream([first, NoRouteError("m", "no other healthy node serving 'm'")])
    assert "without a finish_reason" in out[-1]["error"]["message"]
    assert not [c for c in out if c.get("choices") and c["choices"][0].get("finish_reason")]
    assert ended.stream_error is not None and ended.status == "stream_error"


async def test_token_ids_are_stripped_unless_asked_for() -> None:
    first = opened(NODE_A, [chunk([], ""), chunk([1], "a"), chunk([], "", "stop"), usage(5, 1)])
    out, _, _ = await stream([first])
    assert all("token_ids" not in choice for c in out for choice in c["choices"])
    assert all("usage" not in c for c in out)


async def test_the_prompt_an_upstream_counted_at_the_open_is_the_calls_never_the_clients() -> None:
    """A node says the prompt's count as its stream opens (on the first chunk, from its headers):
    the call keeps it for the /v1/messages door's message_start, and no chunk carries it out,
    whichever chunk an upstream put it on."""
    opening = {
        **chunk([], ""),
        OPENED_USAGE_FIELD: {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}},
    }
    later = {**chunk([1], "a"), OPENED_USAGE_FIELD: {"prompt_tokens": 1}}
    first = opened(NODE_A, [opening, later, chunk([], "", "stop"), usage(9, 1)])
    failover = ScriptedFailover([first])
    p = pipeline(failover, Told())
    ctx = p.start_call({})
    p.authenticate(ctx, f"Bearer {KEY}")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 10}
    body["stream_options"] = {"include_usage": True}
    served = await p.stream(ctx, "chat", msgspec.convert(body, ChatCompletionRequest), body)
    try:
        out = [as_wire(c) async for c in served.items()]
    finally:
        await served.aclose()
    assert ctx.served is not None and ctx.served.opened_usage is not None
    assert (ctx.served.opened_usage.prompt_tokens, ctx.served.opened_usage.cached_tokens) == (9, 4)
    assert all(OPENED_USAGE_FIELD not in c for c in out) and out[-1]["usage"]["prompt_tokens"] == 9


async def test_a_break_that_cannot_be_continued_ends_with_an_error_event() -> None:
    first = opened(NODE_A, [chunk([], ""), chunk([1], "a"), UpstreamError("reset", status_code=502)])
    out, _, ended = await stream([first, NoRouteError("m", "no other healthy node serving 'm'")])
    assert out[-1]["error"]["code"] == "stream_interrupted"
    assert "no other healthy node" in out[-1]["error"]["message"]
    assert ended.stream_error is not None and ended.status == "stream_error"


async def test_a_break_after_the_finish_chunk_needs_no_continuation() -> None:
    first = opened(
        NODE_A,
        [chunk([], ""), chunk([1], "a"), chunk([], "", "stop"), UpstreamError("reset", status_code=502)],
    )
    out, failover, _ = await stream([first], max_tokens=2)
    assert failover.asked == [], "only the usage chunk was lost"
    assert "error" not in out[-1]
    assert [c["choices"][0]["finish_reason"] for c in out if c.get("choices")][-1] == "stop"


async def test_a_break_before_the_finish_chunk_asks_the_next_node_how_the_stream_ended() -> None:
    # Every token of the budget was sent, but the last one may also have ended the stream by a
    # stop string or stop token: only a node that replays the tokens can tell.
    first = opened(
        NODE_A, [chunk([], ""), chunk([1], "a"), chunk([2], "b"), UpstreamError("reset", status_code=502)]
    )
    second = opened(NODE_B, [chunk([], ""), chunk([], "", "stop"), usage(7, 0)])
    out, failover, ended = await stream([first, second], max_tokens=2, stream_options={"include_usage": True})
    [asked] = failover.asked
    assert asked["body"]["continuation_token_ids"] == [1, 2]
    assert asked["body"]["max_tokens"] == 0
    assert [c["choices"][0]["finish_reason"] for c in out if c.get("choices")][-1] == "stop"
    assert out[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert ended.stream_error is None and ended.status == "200"


async def test_a_stream_broken_on_every_node_says_so_rather_than_blaming_residency() -> None:
    first = opened(NODE_A, [chunk([], ""), chunk([1], "a"), UpstreamError("a failed: ReadError")])
    second = opened(NODE_B, [chunk([], ""), chunk([2], "b"), UpstreamError("b failed: ReadError")])
    out, failover, ended = await stream([first, second])
    assert failover.broken == ["a:broken", "b:broken"]
    message = out[-1]["error"]["message"]
    assert message == (
        "The stream from b broke (b failed: ReadError) and no other upstream could continue it: "
        "no healthy node serving 'm' anywhere; 2 nodes already tried for this request."
    )
    assert ended.stream_error == message and ended.status == "stream_error"


# -- the continuation rule alone (pure) ------------------------------------------------------


def _plan(**overrides: Any) -> RequestPlan:
    fields: dict[str, Any] = {
        "endpoint": "chat",
        "model": CatalogModel("m", "small"),
        "base_body": {"messages": [{"role": "user", "content": "hi"}]},
        "stream": True,
        "max_tokens": 10,
        "prompt_tokens_estimate": 5,
        "estimated_tokens": 15,
        "include_usage": False,
        "wants_token_ids": False,
        "affinity_key": "",
        "n": 1,
    }
    fields.update(overrides)
    return RequestPlan(**fields)


def _break(**overrides: Any) -> StreamBreak:
    fields: dict[str, Any] = {
        "target": NODE_A,
        "error": UpstreamError("reset"),
        "emitted": (1, 2, 3),
        "finished": False,
        "ids_complete": True,
    }
    fields.update(overrides)
    return StreamBreak(**fields)


def test_a_continuation_carries_the_clients_own_tokens_then_every_token_it_was_sent() -> None:
    step = decide(
        _plan(base_body={"continuation_token_ids": [7]}), _break(), continuations=0, max_continuations=2
    )
    assert step == Continue(token_ids=(7, 1, 2, 3), max_tokens=7, carried=3)
    body = step.body(_plan())
    assert body["continuation_token_ids"] == [7, 1, 2, 3] and body["max_tokens"] == 7
    assert "model" not in body  # the forwarder asks each target for the model it serves


def test_a_stream_without_a_token_limit_is_continued_without_one() -> None:
    step = decide(_plan(max_tokens=None), _break(), continuations=0, max_continuations=2)
    assert step == Continue(token_ids=(1, 2, 3), max_tokens=None, carried=3)
    assert "max_tokens" not in step.body(_plan(max_tokens=None))


@pytest.mark.parametrize(
    ("plan_fields", "break_fields", "continuations", "why"),
    [
        ({"n": 2}, {}, 0, "n > 1"),
        ({"base_body": {"echo": True}}, {}, 0, "echo"),
        ({}, {"ids_complete": False}, 0, "did not report token ids"),
        ({}, {}, 2, "already continued 2 times"),
    ],
)
def test_streams_that_cannot_be_continued_exactly_end_with_the_reason(
    plan_fields: dict[str, Any], break_fields: dict[str, Any], continuations: int, why: str
) -> None:
    step = decide(
        _plan(**plan_fields), _break(**break_fields), continuations=continuations, max_continuations=2
    )
    assert isinstance(step, Stop) and step.ending == "error"
    assert why in step.why and "broke (reset)" in step.why

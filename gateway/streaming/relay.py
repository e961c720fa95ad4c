"""Relaying one client stream: upstream chunks in, client chunks out, and what was sent.

Backpressure: `chunks()` reads the next upstream chunk only after the client's side took the
previous one, so a slow client slows the node rather than filling gateway memory.

The relay never decides what happens after a break. When its upstream fails mid-stream it closes
that upstream, stops, and leaves a `StreamBreak` report in `broken`; the pipeline decides (see
continuation.py) and may `resume` the relay on another upstream. Across upstreams the client sees
one stream: the first upstream's id, time and model, and usage that counts the carried-over tokens
as completion. A continuation generates only tokens the client does not have, so every chunk is
passed on as it comes.

The relay also times its waits on upstream chunks and takes each upstream's `timings` reports
into the call's Latency; the usage chunk the client gets carries the gateway's whole breakdown.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from gateway.request.latency import Latency
from gateway.request.plan import RequestPlan
from gateway.streaming.continuation import Continue, StreamBreak
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import OpenedStream
from protocol.timing import TIMINGS_FIELD, timing_from_wire
from router.types import Target


class StreamRelay:
    def __init__(self, opened: OpenedStream, plan: RequestPlan, latency: Latency) -> None:
        self.usage: dict[str, Any] | None = None  # the client-facing usage, once known
        self.broken: StreamBreak | None = None  # set when the current upstream broke
        self.emitted: list[int] = []
        self.continuations = 0
        self.finish_reason: str | None = None
        self._current = opened
        self._first: dict[str, Any] | None = opened.first
        self._plan = plan
        self._ids_complete = True  # every content chunk so far carried its token ids
        self._content_chunks = 0
        self._finished = False
        self._carried = 0  # generated tokens handed to the current upstream as continuation
        self._identity: dict[str, Any] = {}
        self._latency = latency
        latency.answered(timing_from_wire(opened.first.pop(TIMINGS_FIELD, None)))

    @property
    def target(self) -> Target:
        return self._current.target

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Client chunks from the current upstream until it ends, or breaks (then `broken` is set)."""
        continuation = self.continuations > 0
        latency = self._latency
        try:
            if self._first is not None:
                first, self._first = self._first, None
                out = self._accept(first, continuation=continuation)
                if out is not None:
                    yield out
            upstream = self._current.chunks
            while True:
                since = time.monotonic()
                try:
                    chunk = await anext(upstream)
                except StopAsyncIteration:
                    break
                finally:
                    latency.waited_since(since)
                out = self._accept(chunk, continuation=continuation)
                if out is not None:
                    yield out
        except UpstreamError as error:
            self.broken = StreamBreak(
                target=self._current.target,
                error=error,
                emitted=tuple(self.emitted),
                finished=self._finished,
                ids_complete=self._ids_complete,
            )
            await self._current.aclose()

    def resume(self, opened: OpenedStream, continuation: Continue) -> None:
        """Go on from `opened`, whose upstream was given `continuation`."""
        self.broken = None
        self.continuations += 1
        self._current = opened
        self._first = opened.first
        self._carried = continuation.carried
        self._latency.answered(timing_from_wire(opened.first.pop(TIMINGS_FIELD, None)))

    async def aclose(self) -> None:
        await self._current.aclose()

    @property
    def finished(self) -> bool:
        """An upstream sent a finish_reason: the client got a complete answer."""
        return self._finished

    def completion_tokens(self) -> int:
        """Tokens the client received: exact from usage or token ids, else one per content chunk."""
        if self.usage is not None:
            return int(self.usage.get("completion_tokens", 0))
        return len(self.emitted) if self.emitted else self._content_chunks

    def _accept(self, chunk: dict[str, Any], *, continuation: bool) -> dict[str, Any] | None:
        """Track a chunk's tokens and rewrite it for the client; None drops it."""
        reported = chunk.pop(TIMINGS_FIELD, None)
        if reported is not None:
            self._latency.finished_upstream(timing_from_wire(reported))
        if not self._identity:
            # One stream as far as the client can tell: the first upstream's id, time and model.
            self._identity = {
                "id": chunk.get("id"),
                "created": chunk.get("created"),
                "model": self.target.model,
            }
        choices = chunk.get("choices") or []
        role_only = bool(choices)
        for choice in choices:
            ids = choice.pop("token_ids", None)
            if ids and self._plan.wants_token_ids:
                choice["token_ids"] = ids
            if self._plan.cascade is not None and not self._plan.wants_logprobs:
                choice.pop("logprobs", None)  # asked for by the confidence cascade, not the client
            text = choice_text(choice)
            if ids:
                self.emitted.extend(ids)
            if text:
                self._content_chunks += 1
                if not ids:
                    self._ids_complete = False
            if choice.get("finish_reason"):
                self._finished = True
                self.finish_reason = choice["finish_reason"]
            role_only = role_only and not ids and not text and not choice.get("finish_reason")
        usage = chunk.get("usage")
        if usage:
            self.usage = self._client_usage(usage)
        if not self._plan.include_usage:
            chunk.pop("usage", None)
        elif usage:
            chunk["usage"] = self.usage
            chunk[TIMINGS_FIELD] = self._latency.timing().to_wire()
        if (continuation and role_only) or (not choices and "usage" not in chunk):
            return None  # the client already has the assistant role; or nothing left to send
        chunk.update(self._identity)
        return chunk

    def _client_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """A continuation node counts the carried-over tokens as prompt; the client generated them."""
        carried = self._carried
        if not carried:
            return usage
        prompt = max(0, int(usage.get("prompt_tokens", 0)) - carried)
        completion = int(usage.get("completion_tokens", 0)) + carried
        out = {
            **usage,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and int(details.get("cached_tokens") or 0) > prompt:
            # The node's cache hits may cover carried tokens too; the client's prompt is smaller.
            out["prompt_tokens_details"] = {**details, "cached_tokens": prompt}
        return out


def choice_text(choice: Mapping[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or ""
    return choice.get("text") or ""


def error_event(message: str) -> dict[str, Any]:
    """The OpenAI-style error event that ends a stream which could not be finished."""
    return {
        "error": {"message": message, "type": "server_error", "param": None, "code": "stream_interrupted"}
    }

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
from collections.abc import AsyncIterator

from msgspec import UNSET

from gateway.call.continuation import Continue, StreamBreak
from gateway.call.latency import Latency
from gateway.call.plan import RequestPlan
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import OpenedStream
from protocol.chunk import Chunk, Usage, usage_of
from protocol.timing import timing_from_wire
from router.types import Target


class StreamRelay:
    def __init__(self, opened: OpenedStream, plan: RequestPlan, latency: Latency) -> None:
        self.usage: Usage | None = None  # the client-facing usage, once known
        self.broken: StreamBreak | None = None  # set when the current upstream broke
        self.emitted: list[int] = []
        self.continuations = 0
        self.finish_reason: str | None = None
        # Why the stream ended with an error event: the pipeline's decision after a break (`stop`).
        self.stopped: str | None = None
        self._current = opened
        self._first: Chunk | None = opened.first
        self._plan = plan
        self._ids_complete = True  # every content chunk so far carried its token ids
        self._content_chunks = 0
        self._finished: set[int] = set()  # choices whose finish_reason the client got
        self._carried = 0  # generated tokens handed to the current upstream as continuation
        self._identity: tuple[str, int] | None = None
        self._latency = latency
        latency.answered(timing_from_wire(_take_timings(opened.first)))
        # The prompt as the upstream that opened the stream counted it (before any usage chunk);
        # None where it did not say. _accept takes the field out of every chunk.
        self.opened_usage = usage_of(opened.first.opened_usage)

    @property
    def target(self) -> Target:
        return self._current.target

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Client chunks from the current upstream until it ends, or breaks (then `broken` is set).
        An upstream that ends before every choice got its finish_reason has broken too: a stream
        is never passed off as finished when its upstream did not say so."""
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
            if not self.finished:
                raise UpstreamError(
                    f"{self.target.target_id} ended the stream without a finish_reason", status_code=502
                )
        except UpstreamError as error:
            self.broken = StreamBreak(
                target=self._current.target,
                error=error,
                emitted=tuple(self.emitted),
                finished=self.finished,
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
        self._latency.answered(timing_from_wire(_take_timings(opened.first)))

    def stop(self, why: str) -> None:
        """The stream ends here with an error event saying `why` (no upstream continues it)."""
        self.stopped = why

    async def aclose(self) -> None:
        await self._current.aclose()

    @property
    def finished(self) -> bool:
        """Every choice got its finish_reason: the client has a complete answer."""
        return len(self._finished) >= self._plan.n

    def completion_tokens(self) -> int:
        """Tokens the client received: exact from usage or token ids, else one per content chunk."""
        if self.usage is not None:
            return self.usage.completion_tokens
        return len(self.emitted) if self.emitted else self._content_chunks

    def _accept(self, chunk: Chunk, *, continuation: bool) -> Chunk | None:
        """Track a chunk's tokens and rewrite it for the client; None drops it."""
        reported = _take_timings(chunk)
        if reported is not None:
            self._latency.finished_upstream(timing_from_wire(reported))
        chunk.opened_usage = UNSET  # an upstream's note to the gateway, never the client's
        if self._identity is None:
            # One stream as far as the client can tell: the first upstream's id, time and model.
            self._identity = (chunk.id, chunk.created)
        plan = self._plan
        role_only = bool(chunk.choices)
        for choice in chunk.choices:
            ids = choice.token_ids if isinstance(choice.token_ids, list) else None
            if not plan.wants_token_ids:
                choice.token_ids = UNSET
            if plan.cascade is not None and not plan.wants_logprobs:
                choice.logprobs = None  # asked for by the confidence cascade, not the client
            text = choice.content()
            if ids:
                self.emitted.extend(ids)
            if text:
                self._content_chunks += 1
                if not ids:
                    self._ids_complete = False
            if choice.finish_reason:
                self._finished.add(choice.index)
                self.finish_reason = choice.finish_reason
            role_only = role_only and not ids and not text and choice.finish_reason is None
        usage = usage_of(chunk.usage)
        if usage is not None:
            self.usage = self._client_usage(usage)
        if not plan.include_usage:
            chunk.usage = UNSET
        elif usage is not None:
            chunk.usage = self.usage
            chunk.timings = self._latency.timing().to_wire()
        if (continuation and role_only) or (not chunk.choices and chunk.usage is UNSET):
            return None  # the client already has the assistant role; or nothing left to send
        chunk.id, chunk.created = self._identity
        chunk.model = self.target.model
        if self.target.version:
            chunk.system_fingerprint = self.target.version
        return chunk

    def _client_usage(self, usage: Usage) -> Usage:
        """A continuation node counts the carried-over tokens as prompt; the client generated them."""
        carried = self._carried
        if not carried:
            return usage
        prompt = max(0, usage.prompt_tokens - carried)
        completion = usage.completion_tokens + carried
        details = usage.prompt_tokens_details
        if isinstance(details, dict) and int(details.get("cached_tokens") or 0) > prompt:
            # The node's cache hits may cover carried tokens too; the client's prompt is smaller.
            details = {**details, "cached_tokens": prompt}
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=details,
            completion_tokens_details=usage.completion_tokens_details,
        )


def _take_timings(chunk: Chunk) -> dict[str, float] | None:
    reported = chunk.timings
    chunk.timings = UNSET
    return reported if isinstance(reported, dict) else None

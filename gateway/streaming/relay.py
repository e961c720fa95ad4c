"""Relaying one stream to the client, and continuing it elsewhere when the upstream breaks.

Backpressure: `chunks()` is an async generator that reads the next upstream chunk only after the
client's side took the previous one, so a slow client slows the node rather than filling gateway
memory. Cancellation: closing the generator closes the upstream response, which aborts the
sequence on the node.

Continuation: streams to our nodes carry each chunk's `token_ids`. When a stream breaks after
chunks went out, the same request goes to another node of the same model (routed again, so still
inside the tenant's residency) with `continuation_token_ids` = the tokens already emitted and
max_tokens reduced by as many; with greedy sampling the client receives exactly the tokens (and
text) one unbroken stream would have produced. Tokens whose text the node had not sent yet (half
of a UTF-8 character, or text held back as a possible stop string) are not carried over but
generated again, their ids not sent twice; so their text, and stop strings, come out as they would
have. When continuing is impossible the stream ends with an OpenAI-style error event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from gateway.metrics import GatewayMetrics
from gateway.request.plan import RequestPlan
from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import BodyFor, Forwarder, OpenedStream, next_chunk
from protocol import APIError
from router.types import Target

# Routes a continuation: (target ids to avoid, body builder) -> an opened stream, or APIError.
Reopen = Callable[[frozenset[str], str, BodyFor], Awaitable[OpenedStream]]


class StreamRelay:
    def __init__(
        self,
        opened: OpenedStream,
        *,
        plan: RequestPlan,
        forwarder: Forwarder,
        metrics: GatewayMetrics,
        reopen: Reopen,
        idle_s: float,
        max_continuations: int,
    ) -> None:
        self.target: Target = opened.target
        self.usage: dict[str, Any] | None = None  # the client-facing usage, once known
        self.error: str | None = None  # why the stream ended with an error event
        self.emitted: list[int] = []
        self._current = opened
        self._plan = plan
        self._forwarder = forwarder
        self._metrics = metrics
        self._reopen = reopen
        self._idle_s = idle_s
        self._max_continuations = max_continuations
        self._continuations = 0
        self._failed: set[str] = set()
        self._ids_complete = True  # every content chunk so far carried its token ids
        self._content_chunks = 0
        self._finished = False
        self._length_reached = False
        # Tokens whose text the client has: those up to the last chunk that carried text. Tokens
        # after it (an incomplete UTF-8 character, or text held back as a possible stop string)
        # are generated again by a continuation, so that their text is not lost.
        self._flushed = 0
        self._replay: list[int] = []  # regenerated ids the client already has: not sent again
        self._carried = 0  # generated tokens handed to the current upstream as continuation
        self._identity: dict[str, Any] = {}
        self._closed = False

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """OpenAI chunk dicts for the client; the last one is `{"error": ...}` if the stream failed."""
        try:
            chunk: dict[str, Any] | None = self._current.first
            continuation = False
            while True:
                try:
                    while chunk is not None:
                        out = self._accept(chunk, continuation=continuation)
                        if out is not None:
                            yield out
                        chunk = await next_chunk(self._current.chunks, self._idle_s)
                    return
                except UpstreamError as error:
                    opened = await self._recover(error)
                    if opened is None:
                        if self._length_reached:
                            yield self._finish_chunk("length")
                        elif not self._finished:
                            yield self._error_event()
                        return
                    chunk, continuation = opened.first, True
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._current.aclose()

    async def _recover(self, error: UpstreamError) -> OpenedStream | None:
        """After a break: a continuation stream, or None (finished already, or impossible)."""
        broken = self._current.target
        self._forwarder.record_failure(broken, error, outcome="broken")
        self._failed.add(broken.target_id)
        await self._current.aclose()
        if self._finished:
            return None  # the client has every token; only the trailing usage chunk was lost
        why_not = self._why_not_continuable()
        if why_not is not None:
            self.error = f"The stream from {broken.target_id} broke ({error.message}) and {why_not}."
            return None
        flushed = self.emitted[: self._flushed]
        remaining = None if self._plan.max_tokens is None else self._plan.max_tokens - len(flushed)
        if remaining is not None and remaining <= 0:
            self._length_reached = True  # the break hid only the finish chunk; nothing is left
            return None
        base = list(self._plan.base_body.get("continuation_token_ids") or [])
        continuation = base + flushed

        def body_for(target: Target) -> dict[str, Any]:
            body = self._plan.body_for(target, stream=True)
            body["continuation_token_ids"] = continuation
            if remaining is not None:
                body["max_tokens"] = remaining
            return body

        try:
            opened = await self._reopen(frozenset(self._failed), broken.model, body_for)
        except APIError as exc:
            self.error = f"The stream from {broken.target_id} broke ({error.message}) and could not be continued: {exc.message}"
            return None
        self._continuations += 1
        self._metrics.failovers.labels("continuation").inc()
        self._current = opened
        self._carried = len(flushed)
        self._replay = self.emitted[self._flushed :]
        return opened

    def _why_not_continuable(self) -> str | None:
        if self._current.target.kind != "node":
            return "streams from commercial providers cannot be continued elsewhere"
        if self._plan.n != 1:
            return "streams with n > 1 cannot be continued elsewhere"
        if self._plan.base_body.get("echo"):
            return "streams with echo cannot be continued elsewhere"
        if not self._ids_complete:
            return "the node did not report token ids, so the stream cannot be continued exactly"
        if self._continuations >= self._max_continuations:
            return f"it was already continued {self._continuations} times"
        return None

    def _accept(self, chunk: dict[str, Any], *, continuation: bool) -> dict[str, Any] | None:
        """Track a chunk's tokens and rewrite it for the client; None drops it."""
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
            raw_ids = choice.pop("token_ids", None)
            ids = self._new_ids(raw_ids)
            if ids and self._plan.wants_token_ids:
                choice["token_ids"] = ids
            text = _choice_text(choice)
            if ids:
                self.emitted.extend(ids)
            if text and not raw_ids:
                self._ids_complete = False
            if text:
                self._content_chunks += 1
                self._flushed = len(self.emitted) - len(self._replay)
            if choice.get("finish_reason"):
                self._finished = True
            role_only = role_only and not ids and not text and not choice.get("finish_reason")
        usage = chunk.get("usage")
        if usage:
            self.usage = self._client_usage(usage)
        if self._plan.include_usage:
            if usage:
                chunk["usage"] = self.usage
        else:
            chunk.pop("usage", None)
        if (continuation and role_only) or (not choices and "usage" not in chunk):
            return None  # the client already has the assistant role; or nothing left to send
        chunk.update(self._identity)
        return chunk

    def _new_ids(self, ids: list[int] | None) -> list[int] | None:
        """A chunk's token ids minus those a continuation regenerates that the client already has."""
        if not ids or not self._replay:
            return ids
        n = min(len(ids), len(self._replay))
        # With greedy sampling the regenerated ids equal the ones sent; with sampling they may not,
        # and the client keeps the ones it got (the text comes from the continuation).
        self._replay = self._replay[n:]
        return ids[n:]

    def _client_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """A continuation node counts the carried-over tokens as prompt; the client generated them."""
        carried = self._carried
        if not carried:
            return usage
        prompt = max(0, int(usage.get("prompt_tokens", 0)) - carried)
        completion = int(usage.get("completion_tokens", 0)) + carried
        return {
            **usage,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _finish_chunk(self, reason: str) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        choice.update({"delta": {}} if self._plan.endpoint == "chat" else {"text": ""})
        kind = "chat.completion.chunk" if self._plan.endpoint == "chat" else "text_completion"
        return {**self._identity, "object": kind, "choices": [choice]}

    def _error_event(self) -> dict[str, Any]:
        message = self.error or "The upstream stream broke."
        return {
            "error": {"message": message, "type": "server_error", "param": None, "code": "stream_interrupted"}
        }

    def completion_tokens(self) -> int:
        """Tokens the client received: exact from usage or token ids, else one per content chunk."""
        if self.usage is not None:
            return int(self.usage.get("completion_tokens", 0))
        return len(self.emitted) if self.emitted else self._content_chunks


def _choice_text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or ""
    return choice.get("text") or ""

"""The upstream seam: one call to a target that speaks OpenAI's chat/completions wire format.

Regional nodes and commercial providers both implement it, so failover and relaying treat them
alike. Request bodies are OpenAI-format dicts; answers are typed `Completion`s and stream items
typed `Chunk`s (protocol/chunk.py), decoded once by the upstream. An answer, a stream's first
chunk and its usage chunk may carry the upstream's latency breakdown in `timings`
(protocol/timing.py); the request path takes it out before the client sees them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

from protocol.chunk import Chunk, Completion

Endpoint = Literal["chat", "completions"]


class UpstreamError(Exception):
    """An upstream attempt failed. `retryable` errors may be retried on another target
    (connect errors, timeouts, 5xx, 429); others (4xx) go back to the client as they are."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 502,
        retryable: bool = True,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retryable = retryable
        self.body = body
        self.retry_after = retry_after

    @property
    def at_capacity(self) -> bool:
        """The target is up but refused the request for load: a 429, or a 503 with Retry-After
        (a node's queue bound, `overloaded`; a model still loading)."""
        return self.status_code == 429 or (self.status_code == 503 and self.retry_after is not None)


class Upstream(Protocol):
    # Reports each chunk's token ids and accepts `continuation_token_ids`, so a broken stream can
    # go on here token for token (our nodes do; commercial APIs do not).
    token_exact: bool

    async def complete(self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]) -> Completion:
        """Non-streaming call; returns the answer or raises UpstreamError."""
        ...

    def stream(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> AbstractAsyncContextManager[AsyncIterator[Chunk]]:
        """Streaming call: entering raises UpstreamError before the first byte; the iterator
        yields typed chunks and raises UpstreamError if the stream breaks midway.
        Leaving the context closes the upstream connection (which cancels the request)."""
        ...

    async def count_tokens(self, body: dict[str, Any], headers: dict[str, str]) -> int:
        """The input tokens of a chat body's conversation as this target's model reads them (its
        tokenizer and chat template: a node's /tokenize, a provider's count API); raises
        UpstreamError as `complete` does."""
        ...

    async def aclose(self) -> None: ...

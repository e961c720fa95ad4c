"""The confidence cascade's stream work: read the small model's first K tokens without sending
them, and give them back if the small model keeps the request.

The pipeline opens the small upstream's stream (it asks for logprobs: RequestPlan.body), then
`probe` reads chunks until K tokens have come, the answer finished, or the upstream broke. The
chunks read are held, never sent. router.confidence.judge decides on their logprobs. If the small
model keeps the request, `release` is the same upstream stream with the held chunks in front, and
the relay sends them on like any other chunks (so a break after the release continues exactly as
it would have). If not, the pipeline closes the small stream (the node aborts the request and
frees its KV blocks) and serves the large model from the start: the client saw nothing of the
small one. The hold-back is bounded by K tokens: chunks after the K-th are never read here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from gateway.upstreams.base import UpstreamError
from gateway.upstreams.failover import OpenedStream
from protocol.chunk import Chunk, Logprobs
from router.types import Target


@dataclass
class Probe:
    """What the small upstream sent before the decision."""

    held: list[Chunk] = field(default_factory=list)  # chunks read and not yet sent
    logprobs: list[float] = field(default_factory=list)
    tokens: int = 0  # generated tokens in `held` (token ids; a content chunk counts one without)
    finished: bool = False  # the small model's answer ended within the probe
    error: UpstreamError | None = None  # the upstream broke during the probe

    @property
    def judgeable(self) -> bool:
        """Logprobs for every token held: an upstream that sends none cannot be judged."""
        return self.error is None and len(self.logprobs) >= self.tokens


@dataclass(frozen=True)
class Escalated:
    """An `auto` request the cascade moved from the small tier: what the small tier used of it,
    for the quota settlement and the small tier's own usage event."""

    model: str  # the small model
    target: Target  # where it ran
    prompt_tokens: int  # the gateway's estimate: the aborted stream never reported usage
    completion_tokens: int  # generated before the decision (exact: token ids)
    reason: str  # router.confidence's verdict, e.g. low_confidence=score:-3.1<-2.5,...


async def probe(opened: OpenedStream, k_tokens: int) -> Probe:
    """Read `opened` (its first chunk included) until `k_tokens` tokens, a finish or a break."""
    found = Probe()
    chunk: Chunk | None = opened.first
    while chunk is not None:
        found.held.append(chunk)
        _take(found, chunk)
        if found.finished or found.tokens >= k_tokens:
            break
        try:
            chunk = await anext(opened.chunks)
        except StopAsyncIteration:
            break
        except UpstreamError as error:
            found.error = error  # raised again where the relay reaches it (see release)
            break
    return found


def release(opened: OpenedStream, found: Probe) -> OpenedStream:
    """The small upstream's stream as the relay reads it: the held chunks, then the rest."""
    return replace(opened, first=found.held[0], chunks=_replay(found.held[1:], opened.chunks, found.error))


async def _replay(
    held: list[Chunk], rest: AsyncIterator[Chunk], error: UpstreamError | None
) -> AsyncIterator[Chunk]:
    for chunk in held:
        yield chunk
    if error is not None:
        raise error
    async for chunk in rest:
        yield chunk


def _take(found: Probe, chunk: Chunk) -> None:
    for choice in chunk.choices:
        ids = choice.token_ids if isinstance(choice.token_ids, list) else []
        found.tokens += len(ids) if ids else 1 if choice.content() else 0
        found.logprobs.extend(_logprobs(choice.logprobs))
        if choice.finish_reason:
            found.finished = True


def _logprobs(logprobs: Logprobs | None) -> list[float]:
    """A chunk's token logprobs: chat's `content[].logprob` or completions' `token_logprobs`."""
    if logprobs is None:
        return []
    if isinstance(logprobs.content, list):
        return [entry.logprob for entry in logprobs.content]
    if isinstance(logprobs.token_logprobs, list):
        return [value for value in logprobs.token_logprobs if value is not None]
    return []

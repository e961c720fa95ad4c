"""One request's run on the engine: start it, pull its deltas, time it, always end it.

`start_generation` returns only once the engine has produced the first delta, so validation
errors (which the engine raises on the call or before the first delta) become a plain HTTP
error instead of an error event inside a 200 stream; so does a refusal by the engine's full
queue (503 `overloaded` with Retry-After), which takes nothing. Closing a `Generation` aborts its
engine request, which frees its KV blocks at the engine's next step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol.timing import Timing
from regional_node.engine.errors import QueueFullError
from regional_node.server.errors import aborted_error, api_error
from regional_node.server.metrics import NodeMetrics, RequestTimings
from regional_node.server.pool import ServedModel
from regional_node.server.tenancy import Tenancy

if TYPE_CHECKING:
    from regional_node.engine import RequestDelta, SamplingParams
    from regional_node.engine.outputs import Alternatives
    from regional_node.server.tracing import RequestSpan


@dataclass
class GenerationRequest:
    """Everything the engine needs for one request, already translated from the wire format."""

    request_id: str
    model: ServedModel
    prompt_ids: list[int]
    params: SamplingParams
    tenancy: Tenancy
    endpoint: str
    # The request field that holds the prompt, for error params ("messages" or "prompt").
    prompt_param: str
    continuation_ids: list[int] | None = None
    trace: RequestSpan | None = None  # the request's span, when tracing is on
    # The model speculates (`speculative:` set), so Server-Timing and the trace say how this
    # request's speculative steps went (the engine reports them in RequestDelta.drafts).
    reports_speculation: bool = False


@dataclass
class Result:
    """A finished (non-streaming) generation."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[Alternatives]  # each token's alternatives, when the request asked
    finish_reason: str
    stop_reason: str | int | None  # the stop string or stop token id that ended it (RequestDelta)
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass
class SpecTally:
    """One request's speculative decoding, summed from its deltas: decode steps (after the first
    token's), the steps that verified proposals (drafts), the tokens proposed and accepted, and how
    many drafts accepted 0, 1, 2, ... tokens (`accepted_counts[i]`)."""

    steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_counts: list[int] = field(default_factory=list)

    def add(self, delta: RequestDelta, *, decoding: bool) -> None:
        if decoding and delta.new_token_ids:
            self.steps += 1
        counts = self.accepted_counts
        for proposed, accepted in delta.drafts:
            self.drafts += 1
            self.draft_tokens += proposed
            self.accepted_tokens += accepted
            counts.extend([0] * (accepted + 1 - len(counts)))
            counts[accepted] += 1

    def describe(self) -> str:
        """The decode part's Server-Timing description (no commas or quotes: header syntax)."""
        return (
            f"steps={self.steps} drafts={self.drafts} draft_tokens={self.draft_tokens} "
            f"accepted={self.accepted_tokens}"
        )


@dataclass
class _Clock:
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)

    queue_wait: float | None = None
    prefill: float | None = None

    def split(self, delta: RequestDelta) -> None:
        """Take the engine's queue/prefill split from the first delta that carries it; the node
        alone cannot see when the engine first schedules a request."""
        if self.queue_wait is None:
            self.queue_wait = delta.queue_time_s
        if self.prefill is None:
            self.prefill = delta.prefill_time_s

    def tick(self, new_tokens: int) -> None:
        if new_tokens <= 0:
            return
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            # Several tokens in one delta share the gap since the previous delta.
            self.gaps.extend([(now - self.last_token) / new_tokens] * new_tokens)
        self.last_token = now

    def timings(self) -> RequestTimings:
        end = self.last_token or time.perf_counter()
        decode = None if self.first_token is None else end - self.first_token
        ttft = None if self.first_token is None else self.first_token - self.arrival
        return RequestTimings(
            ttft=ttft,
            e2e=end - self.arrival,
            decode=decode,
            inter_token=self.gaps,
            queue_wait=self.queue_wait,
            prefill=self.prefill,
        )


class Generation:
    """A started engine request: iterate for deltas (the first one included), then close."""

    def __init__(
        self,
        request: GenerationRequest,
        metrics: NodeMetrics,
        stream: AsyncIterator[RequestDelta],
        clock: _Clock,
    ) -> None:
        self.request = request
        self._metrics = metrics
        self._stream = stream
        self._clock = clock
        self._pending: RequestDelta | None = None
        self._last: RequestDelta | None = None
        self._closed = False
        self.speculation = SpecTally() if request.reports_speculation else None

    @property
    def finished(self) -> bool:
        return self._last is not None and self._last.finished

    @property
    def last(self) -> RequestDelta | None:
        return self._last

    def timing(self) -> Timing:
        """The breakdown so far, for Server-Timing and the usage chunk (protocol/timing.py)."""
        timings = self._clock.timings()
        return Timing(
            queue=timings.queue_wait, prefill=timings.prefill, decode=timings.decode, total=timings.e2e
        )

    def server_timing(self) -> str:
        """The `Server-Timing` header value: the breakdown so far, its decode part described with
        the request's speculative steps where the engine reports them
        (`decode;dur=41.20;desc="steps=9 drafts=7 draft_tokens=28 accepted=22"`)."""
        header = self.timing().server_timing()
        if self.speculation is None:
            return header
        desc = f';desc="{self.speculation.describe()}"'
        return ", ".join(part + desc if part.startswith("decode;") else part for part in header.split(", "))

    async def _first(self) -> None:
        try:
            self._pending = await anext(self._stream)
        except StopAsyncIteration:
            raise aborted_error() from None
        self._record(self._pending)

    def __aiter__(self) -> AsyncIterator[RequestDelta]:
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[RequestDelta]:
        if self._pending is not None:
            delta, self._pending = self._pending, None
            yield delta
            if delta.finished:
                return
        async for delta in self._stream:
            self._record(delta)
            yield delta
            if delta.finished:
                return

    def _record(self, delta: RequestDelta) -> None:
        self._last = delta
        if self.speculation is not None:
            self.speculation.add(delta, decoding=self._clock.first_token is not None)
        self._clock.split(delta)
        self._clock.tick(len(delta.new_token_ids))

    async def close(self, outcome: str | None = None) -> None:
        """End the engine request (abort, if unfinished) and record metrics; idempotent."""
        if self._closed:
            return
        self._closed = True
        # Closing the engine's iterator aborts the request when it has not finished.
        with contextlib.suppress(Exception):
            await self._stream.aclose()  # type: ignore[attr-defined]
        if not self.finished:
            with contextlib.suppress(Exception):
                await self.request.model.engine.abort(self.request.request_id)
        self._observe(outcome)

    def _observe(self, outcome: str | None) -> None:
        request, last = self.request, self._last
        name = request.model.name
        if outcome is None:
            outcome = (
                (last.finish_reason or "incomplete") if last is not None and last.finished else "disconnected"
            )
        self._metrics.count_request(name, request.endpoint, outcome)
        timings = self._clock.timings() if last is not None else None
        if last is not None and timings is not None:
            self._metrics.observe_tokens(
                name, request.tenancy.tenant, last.prompt_tokens, last.num_output_tokens
            )
            self._metrics.observe_timings(name, timings)
        if request.trace is not None:
            request.trace.finish(timings, last, outcome, self.speculation)


async def start_generation(request: GenerationRequest, metrics: NodeMetrics) -> Generation:
    """Submit `request` and wait for its first delta; engine errors become API errors."""
    clock = _Clock()
    tenancy = request.tenancy
    try:
        stream = request.model.engine.generate(
            request.prompt_ids,
            request.params,
            request_id=request.request_id,
            tenant=tenancy.tenant,
            priority=tenancy.priority,
            cache_salt=tenancy.cache_salt,
            continuation_token_ids=request.continuation_ids or None,
        )
    except Exception as exc:
        metrics.count_request(request.model.name, request.endpoint, "error")
        if request.trace is not None:
            request.trace.finish(None, None, "error")
        raise api_error(exc, prompt_param=request.prompt_param) from None
    generation = Generation(request, metrics, stream, clock)
    try:
        await generation._first()
    except QueueFullError as exc:
        # Refused before it entered the engine: there is nothing to abort or free.
        metrics.count_refused(request.model.name, tenancy.priority, exc.reason)
        metrics.count_request(request.model.name, request.endpoint, "overloaded")
        if request.trace is not None:
            request.trace.finish(None, None, "overloaded")
        raise api_error(exc, prompt_param=request.prompt_param) from None
    except BaseException as exc:
        await generation.close("error" if isinstance(exc, Exception) else "disconnected")
        if isinstance(exc, Exception):
            raise api_error(exc, prompt_param=request.prompt_param) from None
        raise
    return generation


async def collect(generation: Generation) -> Result:
    """Run a started generation to the end (non-streaming). An engine abort is an error."""
    text: list[str] = []
    token_ids: list[int] = []
    logprobs: list[float] = []
    top_logprobs: list[Alternatives] = []
    try:
        async for delta in generation:
            text.append(delta.new_text)
            token_ids.extend(delta.new_token_ids)
            logprobs.extend(delta.new_logprobs)
            top_logprobs.extend(delta.new_top_logprobs)
    except Exception as exc:
        await generation.close("error")
        raise api_error(exc, prompt_param=generation.request.prompt_param) from None
    finally:
        await generation.close()
    last = generation.last
    if last is None or not last.finished or last.finish_reason not in ("stop", "length"):
        raise aborted_error()
    return Result(
        text="".join(text),
        token_ids=token_ids,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        prompt_tokens=last.prompt_tokens,
        cached_tokens=last.cached_tokens,
        completion_tokens=last.num_output_tokens,
    )

"""One response's run: its state as the pipeline's chat chunks arrive, the Responses API object
it is read as, and (for a foreground stream) the Responses event stream it writes as it goes.

The run is fed by one task (the gateway's, see store.py) and read by any number of requests:
retrieve reads `to_object()`, a foreground stream reads `events`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Literal

from gateway.responses.items import InputItem, listed
from gateway.responses.output import Event, ItemStatus, ResponseOutput
from gateway.responses.translate import ResponsesRequest
from protocol.chunk import Streamed, StreamFailed, Usage, usage_of

Status = Literal["queued", "in_progress", "completed", "failed", "cancelled", "incomplete"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled", "incomplete"})
# Chat finish reasons that end a response short of its natural end, as the Responses API says it.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class EventFeed:
    """Events from the run to one streaming client. At most `limit` wait unread: the run then
    waits for the client (backpressure, as the chat relay has); the last event never waits."""

    def __init__(self, limit: int = 32) -> None:
        self._events: deque[Event] = deque()
        self._limit = limit
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._closed = False

    async def put(self, event: Event) -> None:
        while len(self._events) >= self._limit and not self._closed:
            self._room.clear()
            await self._room.wait()
        self._events.append(event)
        self._changed.set()

    def close_with(self, events: list[Event]) -> None:
        if self._closed:
            return
        self._events.extend(events)
        self._closed = True
        self._changed.set()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            while self._events:
                yield self._events.popleft()
                self._room.set()
            if self._closed:
                return
            self._changed.clear()
            await self._changed.wait()


class Run:
    def __init__(
        self,
        response_id: str,
        tenant_id: str,
        request: ResponsesRequest,
        *,
        stream: bool,
        earlier: tuple[InputItem, ...] = (),
    ) -> None:
        self.id = response_id
        self.tenant_id = tenant_id
        self.request = request
        self.earlier = earlier  # the conversation of `previous_response_id`, before this input
        self.model = request.model  # the served model once the pipeline planned it
        self.created_at = time.time()
        self.completed_at: float | None = None
        self.status: Status = "queued" if request.background else "in_progress"
        self.error: dict[str, Any] | None = None
        self.incomplete_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.events = EventFeed() if stream else None
        self.task: asyncio.Task[None] | None = None
        # Set once the pipeline's stream opened or failed to: a foreground request answers
        # errors before the first token as HTTP errors.
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A background run's opening is awaited by no one, nor a foreground one whose client left:
        # its failure is the run's `failed` status, not an error for asyncio to log as lost.
        self.opened.add_done_callback(_retrieved)
        self.done = asyncio.Event()
        self._output = ResponseOutput(response_id.removeprefix("resp_"))
        self._answered = False  # a finish_reason arrived
        self._sequence = 0

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    # -- fed by the run's task ------------------------------------------------------------------

    async def started(self, model: str) -> None:
        """The pipeline's stream opened (the first token is in)."""
        self.model = model
        self.status = "in_progress"
        if not self.opened.done():
            self.opened.set_result(None)
        await self._emit(
            ("response.created", {"response": self._snapshot("in_progress", with_output=False)}),
            ("response.in_progress", {"response": self._snapshot("in_progress", with_output=False)}),
        )

    async def feed(self, item: Streamed) -> None:
        """One item of the pipeline's stream: a chat chunk, or the error that ends it."""
        if isinstance(item, StreamFailed):
            if item.code == "content_policy_violation":
                # A blocked answer is incomplete, as OpenAI says it, not a server failure.
                self.incomplete_reason = "content_filter"
                self._end("incomplete")
            else:
                self._end("failed", error={"code": "server_error", "message": item.message})
            return
        usage = usage_of(item.usage)
        if usage is not None:
            self.usage = _usage(usage)
        await self._emit(*self._output.feed(item))
        for choice in item.choices:
            reason = choice.finish_reason
            if reason is not None:
                self._answered = True
            if reason in _INCOMPLETE:
                self.incomplete_reason = _INCOMPLETE[reason]

    def ended(self) -> None:
        """The stream ended of itself: completed only if the answer finished (the pipeline ends a
        stream without its finish with an error, so this is a backstop, never a made-up finish)."""
        if self.finished:
            return
        if not self._answered:
            self._end(
                "failed", error={"code": "server_error", "message": "The stream ended without a finish."}
            )
            return
        self._end("incomplete" if self.incomplete_reason else "completed")

    def failed_to_open(self, error: dict[str, Any], exc: BaseException) -> None:
        self._end("failed", error=error)
        if not self.opened.done():
            self.opened.set_exception(exc)

    def cancelled(self) -> None:
        if self.finished:
            return
        self._end("cancelled")
        if not self.opened.done():
            self.opened.set_result(None)  # a foreground request answers the cancelled object

    # -- read by requests -----------------------------------------------------------------------

    def to_object(self) -> dict[str, Any]:
        return self._snapshot(self.status, with_output=True)

    def input_items(self) -> list[dict[str, Any]]:
        """The request's input items as the Responses API lists them, oldest first (not its
        `instructions`, nor the earlier conversation of its `previous_response_id`)."""
        return listed(self.request.input, self.id.removeprefix("resp_"))

    def conversation(self) -> tuple[InputItem, ...]:
        """Everything a follow-up with this response as its `previous_response_id` continues:
        the earlier conversation, this input, this output."""
        return self.earlier + self.request.input + self._output.replay()

    def _end(self, status: Status, *, error: dict[str, Any] | None = None) -> None:
        self.status = status
        self.error = error
        self.completed_at = time.time()
        self.done.set()
        # An answer that ended has each of its items done; one that failed or was cancelled
        # keeps them as they were, as OpenAI's `response.failed` does.
        closing = self._output.close(_item_status(status)) if status in ("completed", "incomplete") else []
        if self.events is None:
            return
        final = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            status, "response.failed"
        )
        closing.append((final, {"response": self.to_object()}))
        self.events.close_with([self._numbered(event) for event in closing])

    async def _emit(self, *events: Event) -> None:
        if self.events is not None:
            for event in events:
                await self.events.put(self._numbered(event))

    def _numbered(self, event: Event) -> Event:
        name, payload = event
        numbered = {"type": name, "sequence_number": self._sequence, **payload}
        self._sequence += 1
        return name, numbered

    def _snapshot(self, status: Status, *, with_output: bool) -> dict[str, Any]:
        request = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": int(self.created_at),
            "completed_at": int(self.completed_at) if self.completed_at is not None else None,
            "status": status,
            "background": request.background,
            "error": self.error,
            "incomplete_details": {"reason": self.incomplete_reason}
            if status == "incomplete" and self.incomplete_reason
            else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "metadata": request.metadata,
            "model": self.model,
            "output": self._output.items(_item_status(status)) if with_output else [],
            # OpenAI's defaults, echoed as it does when a request leaves them out.
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": request.previous_response_id,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_logprobs": request.top_logprobs,
            "tool_choice": request.echoed_tool_choice(),
            "tools": [tool.echoed() for tool in request.tools],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": request.store,
            "usage": self.usage if with_output else None,
            "user": request.user,
        }


def _item_status(status: Status) -> ItemStatus:
    if status in ("queued", "in_progress"):
        return "in_progress"
    return "completed" if status == "completed" else "incomplete"


def _usage(usage: Usage) -> dict[str, Any]:
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens or prompt + completion,
    }


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()

"""Whether and how a broken stream can go on elsewhere: pure decisions on the relay's report.

Streams to our nodes carry each chunk's `token_ids`. When a stream breaks after chunks went out,
the same request can go to another node of the same model with `continuation_token_ids` = the
tokens already emitted and max_tokens reduced by as many; with greedy sampling the client then
receives exactly the tokens (and text) one unbroken stream would have produced. Tokens whose text
the client does not have yet (half of a UTF-8 character, or text held back as a possible stop
string) are not carried over but generated again, so their text, and stop strings, come out as
they would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.request.plan import RequestPlan
from gateway.upstreams.base import UpstreamError
from router.types import Target


@dataclass(frozen=True)
class StreamBreak:
    """What the relay reports when its upstream broke mid-stream."""

    target: Target  # the upstream that broke
    error: UpstreamError
    emitted: tuple[int, ...]  # token ids the client was sent, in order
    flushed: int  # how many of `emitted` the client also has the text of
    finished: bool  # a finish_reason already reached the client
    ids_complete: bool  # every content chunk so far carried its token ids


@dataclass(frozen=True)
class Continue:
    """Go on elsewhere: the next upstream is told these tokens were already generated."""

    token_ids: tuple[int, ...]  # continuation_token_ids: the client's own, then the flushed tokens
    max_tokens: int | None  # what is left of the request's budget
    carried: int  # generated tokens handed over (the client's usage counts them as completion)

    def body(self, plan: RequestPlan, target: Target) -> dict[str, Any]:
        body = plan.body_for(target, stream=True)
        body["continuation_token_ids"] = list(self.token_ids)
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body


@dataclass(frozen=True)
class Stop:
    """End the stream here: `done` (the client has everything), `length` (only the finish chunk
    was lost, and the budget is spent) or `error` (an error event saying `why`)."""

    ending: Literal["done", "length", "error"]
    why: str = ""


def decide(
    plan: RequestPlan, report: StreamBreak, *, continuations: int, max_continuations: int
) -> Continue | Stop:
    """The one rule for a broken stream."""
    if report.finished:
        return Stop("done")  # the client has every token; only the trailing usage chunk was lost
    broke = f"The stream from {report.target.target_id} broke ({report.error.message})"
    why_not = _why_not_continuable(plan, report, continuations, max_continuations)
    if why_not is not None:
        return Stop("error", f"{broke} and {why_not}.")
    flushed = report.emitted[: report.flushed]
    remaining = None if plan.max_tokens is None else plan.max_tokens - len(flushed)
    if remaining is not None and remaining <= 0:
        return Stop("length")  # the break hid only the finish chunk; nothing is left to generate
    base = tuple(plan.base_body.get("continuation_token_ids") or ())
    return Continue(token_ids=base + flushed, max_tokens=remaining, carried=len(flushed))


def _why_not_continuable(
    plan: RequestPlan, report: StreamBreak, continuations: int, max_continuations: int
) -> str | None:
    if plan.n != 1:
        return "streams with n > 1 cannot be continued elsewhere"
    if plan.base_body.get("echo"):
        return "streams with echo cannot be continued elsewhere"
    if not report.ids_complete:
        return "the upstream did not report token ids, so the stream cannot be continued exactly"
    if continuations >= max_continuations:
        return f"it was already continued {continuations} times"
    return None

"""Whether and how a broken stream can go on elsewhere: pure decisions on the relay's report.

Streams to our nodes carry each chunk's `token_ids`. When a stream breaks after chunks went out,
the same request goes to another node of the same model with `continuation_token_ids` = every
token the client was sent (after the client's own continuation tokens, if it sent any) and
max_tokens reduced by as many. The node replays those tokens through the same text logic that
produced the client's chunks, so it holds back exactly what the first node held back (the start
of a possible stop string, half a UTF-8 character) and emits it with the next token; the client
receives exactly the rest of the text (with greedy sampling, of the tokens too) that one unbroken
stream would have produced, and the same finish_reason. A break after the last token's chunk but
before the finish chunk is continued too, with max_tokens 0: the node then only says how the
request ended ("stop" if that token ended it, else "length").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.call.plan import RequestPlan
from gateway.upstreams.base import UpstreamError
from router.types import Target


@dataclass(frozen=True)
class StreamBreak:
    """What the relay reports when its upstream broke mid-stream."""

    target: Target  # the upstream that broke
    error: UpstreamError
    emitted: tuple[int, ...]  # token ids the client was sent, in order
    finished: bool  # a finish_reason already reached the client
    ids_complete: bool  # every content chunk so far carried its token ids


@dataclass(frozen=True)
class Continue:
    """Go on elsewhere: the next upstream is told these tokens were already generated."""

    token_ids: tuple[int, ...]  # continuation_token_ids: the client's own, then those it was sent
    max_tokens: int | None  # what is left of the request's budget
    carried: int  # generated tokens handed over (the client's usage counts them as completion)

    def body(self, plan: RequestPlan) -> dict[str, Any]:
        body = plan.body(stream=True)
        body["continuation_token_ids"] = list(self.token_ids)
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body


@dataclass(frozen=True)
class Stop:
    """End the stream here: `done` (the client has everything) or `error` (an error event saying
    `why`)."""

    ending: Literal["done", "error"]
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
    sent = report.emitted
    remaining = None if plan.max_tokens is None else max(0, plan.max_tokens - len(sent))
    base = tuple(plan.base_body.get("continuation_token_ids") or ())
    return Continue(token_ids=base + sent, max_tokens=remaining, carried=len(sent))


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

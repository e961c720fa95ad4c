"""What the engine hands back: per-step deltas for streaming, whole results for generate()."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class RequestDelta:
    """What one step added to a request. The last delta of a request has finished=True."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[float]
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    num_output_tokens: int
    # Set on the delta carrying a request's first generated token: arrival → first scheduled,
    # and first scheduled → first token (the prefill, chunks and preemptions included).
    queue_time_s: float | None = None
    prefill_time_s: float | None = None
    # The speculative verifications whose tokens this delta carries, as (tokens proposed, tokens
    # accepted); empty when none. The node reports them per request (Server-Timing, its trace); the
    # engine's totals are in stats().
    drafts: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class RequestOutput:
    """A finished request. `text` is empty when the checkpoint has no tokenizer."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] = field(default_factory=list)

    def add(self, delta: RequestDelta) -> None:
        self.output_token_ids.extend(delta.new_token_ids)
        self.text += delta.new_text
        self.logprobs.extend(delta.new_logprobs)
        self.cached_tokens = delta.cached_tokens
        self.prompt_tokens = delta.prompt_tokens
        if delta.finished:
            self.finish_reason = delta.finish_reason

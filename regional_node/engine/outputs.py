"""What the engine hands back: per-step deltas for streaming, whole results for generate()."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]

# A token's most likely alternatives, most likely first: (token id, logprob) from the distribution
# it was sampled from (the same as its own logprob's).
Alternatives = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Finish:
    """How a request ended. `stop_reason` is vLLM's: the stop string or stop token id that ended it,
    None when something else did (EOS included, as vLLM reports it)."""

    reason: FinishReason
    stop_reason: str | int | None = None


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
    # With finish_reason "stop": the stop string or stop token id that ended the request (Finish).
    stop_reason: str | int | None = None
    # Set on the delta carrying a request's first generated token: arrival → first scheduled,
    # and first scheduled → first token (the prefill, chunks and preemptions included).
    queue_time_s: float | None = None
    prefill_time_s: float | None = None
    # The speculative verifications whose tokens this delta carries, as (tokens proposed, tokens
    # accepted); empty when none. The node reports them per request (Server-Timing, its trace); the
    # engine's totals are in stats().
    drafts: list[tuple[int, int]] = field(default_factory=list)
    # Each new token's most likely alternatives (SamplingParams.top_logprobs; else empty).
    new_top_logprobs: list[Alternatives] = field(default_factory=list)


@dataclass
class RequestOutput:
    """A finished request. `text` is empty when the checkpoint has no tokenizer."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[Alternatives] = field(default_factory=list)

    def add(self, delta: RequestDelta) -> None:
        self.output_token_ids.extend(delta.new_token_ids)
        self.text += delta.new_text
        self.logprobs.extend(delta.new_logprobs)
        self.top_logprobs.extend(delta.new_top_logprobs)
        self.cached_tokens = delta.cached_tokens
        self.prompt_tokens = delta.prompt_tokens
        if delta.finished:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason

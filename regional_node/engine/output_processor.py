"""Per-request output state: appends sampled tokens, decides when a request stops, and produces
the text delta each step (detokenization plus stop-string hold-back)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from regional_node.engine.detokenizer import IncrementalDetokenizer
from regional_node.engine.outputs import Alternatives, Finish, RequestDelta
from regional_node.engine.sampler import SampledToken
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.sequence import Sequence
from regional_node.engine.stop_strings import StopStringMatcher


@dataclass(eq=False)
class RequestState:
    seq: Sequence
    params: SamplingParams
    generator: Any  # torch.Generator for sampled requests, None for greedy ones
    stop_token_ids: frozenset[int]  # EOS (unless ignore_eos) and the request's stop_token_ids
    eos_token_ids: frozenset[int]  # those of stop_token_ids that are EOS: no stop_reason for them
    detokenizer: IncrementalDetokenizer | None
    stop_matcher: StopStringMatcher | None
    arrival_time: float = 0.0  # time.monotonic() when the request was added
    first_scheduled_time: float | None = None

    def mark_scheduled(self, now: float) -> None:
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now

    def delta(
        self,
        token_ids: list[int],
        text: str,
        logprobs: list[float],
        finish: Finish | None,
        top_logprobs: list[Alternatives] | None = None,
    ) -> RequestDelta:
        seq = self.seq
        return RequestDelta(
            request_id=seq.request_id,
            new_token_ids=token_ids,
            new_text=text,
            new_logprobs=logprobs,
            new_top_logprobs=top_logprobs or [],
            finished=finish is not None,
            finish_reason=finish.reason if finish is not None else None,
            prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=seq.num_cached_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            stop_reason=finish.stop_reason if finish is not None else None,
        )


def append_token(state: RequestState, sampled: SampledToken) -> RequestDelta:
    """Add one sampled token to the request and say what the client gets for it.

    Stop tokens (EOS unless ignore_eos, and stop_token_ids) stay in the token ids but add no text.
    """
    seq = state.seq
    token, logprob = sampled.token, sampled.logprob
    seq.token_ids.append(token)
    text, finish = _token_text(state, token)
    if finish is None and seq.num_output_tokens >= state.params.max_tokens:
        rest, finish = _end(state, Finish("length"))
        text += rest
    logprobs: list[float] = []
    tops: list[Alternatives] = []
    if state.params.logprobs and logprob is not None:
        logprobs.append(logprob)
        if state.params.top_logprobs:
            tops.append(sampled.top)
    delta = state.delta([token], text, logprobs, finish, tops)
    if seq.num_output_tokens == 1 and state.first_scheduled_time is not None:
        delta.queue_time_s = state.first_scheduled_time - state.arrival_time
        delta.prefill_time_s = time.monotonic() - state.first_scheduled_time
    return delta


def append_tokens(state: RequestState, tokens: list[SampledToken]) -> RequestDelta:
    """Several tokens from one step (a verification's accepted run), one by one through
    `append_token`, merged into one delta; tokens after one that ends the request are dropped, so a
    stop token, stop string or max_tokens inside the run ends it exactly where decoding one token
    at a time would have."""
    delta = append_token(state, tokens[0])
    for sampled in tokens[1:]:
        if delta.finished:
            break
        more = append_token(state, sampled)
        delta.new_token_ids += more.new_token_ids
        delta.new_text += more.new_text
        delta.new_logprobs += more.new_logprobs
        delta.new_top_logprobs += more.new_top_logprobs
        delta.finished, delta.finish_reason = more.finished, more.finish_reason
        delta.stop_reason = more.stop_reason
        delta.num_output_tokens = more.num_output_tokens
    return delta


def replay_tokens(state: RequestState, token_ids: list[int]) -> Finish | None:
    """Take a continuation's tokens (generated earlier, their chunks already with the client)
    through the same per-token text logic as `append_token`, dropping the text the client has.

    The detokenizer and stop matcher then hold exactly what they held on the node that generated
    these tokens (both run the same deterministic code), so text held back there (a possible stop
    string's start, half a UTF-8 character) comes out with the next generated token, as it would
    have there. Returns how the request ends if the carried tokens already end it: a stop token or
    a stop string among them, or no budget left (max_tokens 0) — the original stream broke after
    its last token's chunk but before its finish chunk.
    """
    for token in token_ids:
        _, finish = _token_text(state, token)
        if finish is not None:
            return finish
    # As append_token ends a request at its last token: the held-back text may complete a stop string.
    return _end(state, Finish("length"))[1] if state.params.max_tokens == 0 else None


def _token_text(state: RequestState, token: int) -> tuple[str, Finish | None]:
    """The text one token releases, and a "stop" Finish if it ends the request (a stop token, or
    the end of a stop string); the length limit is the caller's."""
    if token in state.stop_token_ids:
        # vLLM checks EOS before stop_token_ids: EOS has no stop_reason even when also listed.
        return _end(state, Finish("stop", None if token in state.eos_token_ids else token))
    piece = state.detokenizer.push(token) if state.detokenizer is not None else ""
    if state.stop_matcher is not None and piece:
        piece, matched = state.stop_matcher.feed(piece)
        if matched is not None:
            return piece, Finish("stop", matched)
    return piece, None


def _end(state: RequestState, finish: Finish) -> tuple[str, Finish]:
    """The request ends for `finish`: the text still held back, released. Should that text complete
    a stop string, the text stops before it and the stop string is what ended the request (in vLLM
    too a stop string found in the last text overrides the length or stop token)."""
    if state.detokenizer is None:
        return "", finish
    text = state.detokenizer.flush()
    if state.stop_matcher is None:
        return text, finish
    emitted, matched = state.stop_matcher.feed(text)
    if matched is not None:
        return emitted, Finish("stop", matched)
    return emitted + state.stop_matcher.flush(), finish

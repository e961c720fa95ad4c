"""How long a new request waits for its first token on one engine: the model both sides share.

The node admits by it (regional_node/engine/admission.py) and reports its inputs in `/load`; the
gateway's admission (router/overload.py) runs it again with the requests it has admitted since
the node's last report put in front, so both estimate one way. It follows how the engine (ours,
and vLLM's V1 scheduler alike) runs a request:

- a sequence slot: at most `max_num_seqs` sequences run. Those running and those queued ahead
  take the free slots first; a request that finds none waits for running ones to finish, at the
  rate they free slots (`finish_rate`, measured while busy);
- prefill steps: each step batches at most `max_num_batched_tokens` tokens, one decode token per
  running sequence first, then prompt tokens in arrival (priority) order. The request's first
  token comes with the step that finishes its prompt, after the prompts ahead of it. A burst of
  short prompts is one step, not one step per prompt;
- partial prefills (`long_prefill_token_threshold`, our engine's scheduler): a prefill computes at
  most that many tokens per step and one long prompt is prefilled at a time, so the prompts ahead
  pass at that pace; a prompt no longer than the threshold does not wait for them, it starts in
  the next step beside the long one's chunk. The prompts ahead include the one in progress (the
  node reports its tokens still to compute as waiting);
- a step's duration follows its batched tokens: `StepCost`, `base_s + per_token_s * tokens`,
  fitted by the node on its recent steps (drain.py). It is the cost of a batch shape, so it
  holds after an idle spell, when a throughput averaged over a window has nothing to go by.

Pure arithmetic over numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec


class StepCost(msgspec.Struct, frozen=True, kw_only=True):
    """One engine step's duration for `tokens` batched tokens: `base_s + per_token_s * tokens`.
    Both 0: not measured yet (an engine that has not stepped)."""

    base_s: float = 0.0
    per_token_s: float = 0.0

    @property
    def measured(self) -> bool:
        return self.base_s > 0 or self.per_token_s > 0

    def step_s(self, tokens: int) -> float:
        return self.base_s + self.per_token_s * max(tokens, 0)


@dataclass(frozen=True)
class EngineQueue:
    """What is ahead of a new request on one engine, and how the engine runs it."""

    waiting_requests: int  # queued ahead of it (its own tier and higher), not yet running
    waiting_tokens: int  # their prompt tokens still to prefill
    running: int  # sequences running (each decodes one token per step)
    max_num_seqs: int | None  # None: no slot limit known
    max_num_batched_tokens: int  # 0: unknown (then one step takes every prompt)
    step_cost: StepCost
    finish_rate: float = 0.0  # requests finished per second while busy; 0: not measured
    long_prefill_token_threshold: int = 0  # 0: none (a prefill takes the whole step budget)


def first_token_s(
    queue: EngineQueue,
    prompt_tokens: int,
    *,
    unknown_s: float,
    more_requests: int = 0,
    more_tokens: int = 0,
    more_running: int = 0,
    behind_queue: bool = False,
) -> float:
    """Estimated seconds from now to the first token of a new request of `prompt_tokens` tokens
    (module docstring). `unknown_s` stands for a wait nothing measured can bound (no slot free and
    no finish rate yet): 0 to treat it as no wait (admit, let the engine's own bounds judge), a
    large number to treat it as long. `more_requests` and `more_tokens`: waiting work the queue
    does not count yet (the gateway's requests sent since the node's report), as if added to
    `waiting_requests` and `waiting_tokens`; `more_running`: sequences generating that it does not
    count yet (the gateway's requests answered since), as if added to `running`. `behind_queue`:
    a prompt that waits for the prompts ahead however short it is (its cached prefix is still
    being computed by one of them)."""
    waiting = queue.waiting_requests + more_requests
    running = max(queue.running, 0) + more_running
    slot_s = 0.0
    if queue.max_num_seqs is not None:
        short = running + waiting + 1 - queue.max_num_seqs
        if short > 0:
            slot_s = short / queue.finish_rate if queue.finish_rate > 0 else unknown_s
    cost = queue.step_cost
    if not cost.measured:
        return slot_s
    ahead = max(queue.waiting_tokens + more_tokens, 0)
    own = max(prompt_tokens, 1)
    prefill = ahead + own
    # An unknown step size: one step takes every prompt beside the running sequences' decodes.
    budget = queue.max_num_batched_tokens if queue.max_num_batched_tokens > 0 else prefill + running
    decode = min(running, budget - 1)
    chunk = budget - decode
    threshold = queue.long_prefill_token_threshold
    if 0 < own <= threshold and not behind_queue:
        # A short prompt waits for no prompt ahead: one step after the one in progress. Those two
        # steps carry at most a long prompt's chunk each beside the decodes.
        prefill = own + min(ahead, threshold + min(threshold, max(chunk - own, 0)))
        steps = 1
    else:
        steps = math.ceil(prefill / (min(chunk, threshold) if threshold > 0 else chunk))
    # The step in progress (a busy engine is mid-step when the request arrives; its prompt tokens,
    # if any, are still counted as waiting), then the steps that prefill the prompts ahead and
    # this one, each with the running sequences' decode tokens.
    busy = running > 0 or waiting > 0
    in_progress = cost.step_s(decode) if busy else 0.0
    return slot_s + in_progress + steps * cost.step_s(decode) + cost.per_token_s * prefill

"""Draft-model proposals: a smaller checkpoint with the target's vocabulary proposes k tokens
autoregressively, with a paged KV cache of its own kept in step with the target's sequences.

Each target sequence that speculates has a draft-side `Sequence` in the draft's own pool
(`self.blocks`, a BlockManager like the target's, with prefix caching when the target has it). Its
`token_ids` are a copy of the target's verified tokens, to which the proposals are appended while
they are drafted; its block table and computed count are the draft cache's.

One proposal round, for every speculating sequence of the step at once (batched):
  1. catch up: the draft computes the target tokens it has no KV for: after a prefix-cache hit
     or a preemption the prompt positions it lacks (a prefill chunk), in steady state the last one
     or two tokens. Its logits give proposal 1;
  2. k - 1 decode steps feed proposals 1..k-1 and give proposals 2..k.
Greedy requests take the draft's argmax; sampled ones draw from the draft's distribution q with
the request's temperature/top-k/top-p and its generator, and q goes with the proposal into
verification (verify.py: accept with min(1, p/q), else draw from max(0, p - q)).

Roll-back: the draft wrote KV for positions n .. n+k-2 (proposals 1..k-1, after the n target
tokens it had). With a of them accepted, positions up to n + min(a, k-1) - 1 hold verified tokens
and stay; the rest no longer count, and blocks holding only such positions return to the pool.
A cached (hashed) draft block only ever holds verified tokens: it is hashed from the target's
tokens, up to the verified computed count. The draft's blocks are freed when the target sequence
finishes, is aborted or is preempted (then it catches up again, from the draft prefix cache where
it can, when the sequence decodes again).

Draft steps are opportunistic, like the proposals themselves: a sequence the draft pool has no
room for does not speculate this step; a catch-up longer than what is left of the step's token
budget (max_num_batched_tokens) is done in chunks over several steps before it proposes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from regional_node.engine.block_manager import BlockManager
from regional_node.engine.model_runner import ModelRunner, SamplingRequest
from regional_node.engine.sampler import argmax_rows, inverse_cdf, processed_logprobs
from regional_node.engine.scheduler import ScheduledChunk, SchedulerOutput
from regional_node.engine.sequence import Sequence
from regional_node.engine.speculative.proposal import Proposal


@dataclass
class DraftRequest:
    """A sequence that may speculate this step: up to `k` proposals, drawn as its request samples."""

    seq: Sequence
    k: int
    sampling: SamplingRequest


@dataclass
class _DraftState:
    seq: Sequence  # the draft cache's copy of the target sequence
    # The target's token count when proposals were last drafted, and how many: set until the
    # verification's outcome rolls the draft back (step_done).
    proposed_at: int = -1
    num_proposed: int = 0


@dataclass
class _Round:
    """One sequence being drafted this step."""

    request: DraftRequest
    state: _DraftState
    k: int
    tokens: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)


class DraftProposer:
    def __init__(
        self,
        runner: ModelRunner,
        *,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        max_num_batched_tokens: int,
    ) -> None:
        self.runner = runner
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.max_num_batched_tokens = max_num_batched_tokens
        self._states: dict[str, _DraftState] = {}

    # -- proposing ------------------------------------------------------------------------------
    def propose(self, requests: list[DraftRequest]) -> dict[Sequence, Proposal]:
        budget = self.max_num_batched_tokens
        rounds: list[_Round] = []
        catch_up: list[ScheduledChunk] = []
        wanted: list[SamplingRequest | None] = []
        for request in requests:
            if budget == 0:
                break
            state = self._sync(request.seq)
            k = self._reserve(state.seq, request.k)
            if k == 0:
                continue
            draft = state.seq
            n = draft.num_tokens
            start = draft.num_computed_tokens
            todo = n - start
            if todo > budget:
                # Not enough budget left to catch up and propose: catch up part of the way.
                catch_up.append(ScheduledChunk(draft, start, budget))
                wanted.append(None)
                budget = 0
                break
            catch_up.append(ScheduledChunk(draft, start, todo))
            wanted.append(request.sampling)
            budget -= todo
            rounds.append(_Round(request, state, k))
        if not catch_up:
            return {}
        logits = self.runner.last_logits(catch_up, wanted)
        for chunk in catch_up:
            chunk.seq.num_computed_tokens = chunk.start + chunk.num_tokens
            self.blocks.cache_computed(chunk.seq)  # hashes only the target's (verified) tokens
        active = rounds
        step = 0
        while active:
            self._pick(active, logits)
            step += 1
            active = [r for r in active if r.k > step]
            if not active:
                break
            # Feed each sequence's newest proposal (position n + step - 1) to draft the next one.
            chunks = []
            for r in active:
                draft = r.state.seq
                draft.token_ids.append(r.tokens[-1])
                chunks.append(ScheduledChunk(draft, draft.num_tokens - 1, 1))
            logits = self.runner.last_logits(chunks, [r.request.sampling for r in active])
        proposals = {}
        for r in rounds:
            draft = r.state.seq
            n = r.request.seq.num_tokens
            del draft.token_ids[n:]  # the proposals are not the sequence's tokens (yet)
            r.state.proposed_at, r.state.num_proposed = n, len(r.tokens)
            probs = torch.stack(r.probs) if r.probs else None
            proposals[r.request.seq] = Proposal(r.tokens, probs)
        return proposals

    def _sync(self, target: Sequence) -> _DraftState:
        """The draft-side sequence of `target`, holding the target's current tokens; admitted into
        the draft pool (from its prefix cache where possible) if it holds no blocks."""
        state = self._states.get(target.request_id)
        if state is None:
            draft = Sequence(
                target.request_id,
                list(target.token_ids),
                num_prompt_tokens=target.num_prompt_tokens,
                max_tokens=target.max_tokens,
                cache_salt=target.cache_salt,
            )
            state = self._states[target.request_id] = _DraftState(draft)
        else:
            draft = state.seq
            draft.token_ids.extend(target.token_ids[draft.num_tokens :])
        return state

    def _reserve(self, draft: Sequence, k: int) -> int:
        """Blocks for the draft to write up to k - 1 proposals after its tokens; returns the k the
        pool allows (0: none, the draft holds no blocks then for a new sequence)."""
        blocks = self.blocks
        if not draft.block_table:
            hit = blocks.prefix_hit(draft)
            if blocks.admission_cost(draft, hit) > blocks.num_free_blocks:
                return 0
            blocks.admit(draft, hit)
        while k > 0 and blocks.blocks_needed(draft, draft.num_tokens + k - 1) > blocks.num_free_blocks:
            k -= 1
        if k > 0:
            blocks.grow(draft, draft.num_tokens + k - 1)
        return k

    def _pick(self, rounds: list[_Round], logits: torch.Tensor) -> None:
        """Each round's next proposal from its row of the draft's logits."""
        logits = logits.float()
        tokens = argmax_rows(logits).tolist()
        sampled = [i for i, r in enumerate(rounds) if not r.request.sampling[0].greedy]
        if sampled:
            q = processed_logprobs(logits[sampled], [rounds[i].request.sampling[0] for i in sampled]).exp()
            for row, i in enumerate(sampled):
                generator = rounds[i].request.sampling[1]
                uniform = torch.rand((), generator=generator, device=q.device)
                tokens[i] = inverse_cdf(q[row], uniform)
                rounds[i].probs.append(q[row])
        for r, token in zip(rounds, tokens, strict=True):
            r.tokens.append(token)

    # -- after verification ---------------------------------------------------------------------
    def step_done(self, out: SchedulerOutput, num_accepted: list[int]) -> None:
        """Roll each drafted sequence back to its verified positions (see the module docstring);
        free the draft blocks of sequences the target preempted."""
        accepted = {chunk.seq.request_id: a for chunk, a in zip(out.chunks, num_accepted, strict=True)}
        for seq in out.preempted:
            self.release(seq.request_id)
        for request_id, state in self._states.items():
            if state.proposed_at < 0:
                continue
            a = accepted.get(request_id, 0)
            draft = state.seq
            draft.num_computed_tokens = state.proposed_at + min(a, state.num_proposed - 1)
            self.blocks.shrink(draft, draft.num_computed_tokens)
            state.proposed_at = -1

    def release(self, request_id: str) -> None:
        """Free a sequence's draft blocks (finished, aborted or preempted)."""
        state = self._states.pop(request_id, None)
        if state is not None:
            self.blocks.release(state.seq)

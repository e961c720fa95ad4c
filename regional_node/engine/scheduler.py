"""Iteration-level scheduling: which sequences run this step, and how many tokens each computes.

Pure Python over block accounting (no torch), so every rule here is unit-tested directly.

Each step has one token budget (max_num_batched_tokens) shared by decodes and prefill chunks:
  1. running sequences that decode, highest tier and earliest admitted first, get their one token;
     when the pool is out of blocks, the lowest-tier, most recently admitted running sequence is
     preempted (blocks freed, recomputed later with its generated tokens kept), which always lets
     the oldest one proceed;
  2. running sequences part-way through a long prompt get their next chunk from what is left;
  3. then waiting requests are admitted in fairness order (fairness.py) while the budget, the
     sequence limit and the free blocks allow. Admission reserves blocks for all known tokens.
A request that could not fit even alone in the pool is refused when added, so nothing deadlocks.

Partial prefills (vLLM's `long_prefill_token_threshold`): with a threshold, a prefill computes at
most that many tokens per step, and a prompt with more uncached tokens than that is *long*. At most
one long prefill is in progress; a long request waits while one is, and the short ones behind it
(a prompt mostly served from the prefix cache, a short question) are admitted beside it. Without
this a cold 2,000-token prompt is one step of the whole budget, and a request whose prompt is
cached waits for all of it before its own first token: the time cache-aware routing saved is spent
queueing behind another tenant's prompt. Steps stay short, so decodes also keep their pace.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field

from regional_node.engine.block_manager import BlockManager
from regional_node.engine.errors import RequestTooLargeError
from regional_node.engine.fairness import VirtualTokenCounter, WaitingQueue
from regional_node.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    """seq computes tokens [start, start + num_tokens) this step. A speculating decode's last
    `len(draft_token_ids)` of them are proposed tokens, not yet in seq.token_ids, to be verified."""

    seq: Sequence
    start: int
    num_tokens: int
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def completes(self) -> bool:
        """True when the chunk reaches the last known token, so the step samples a new one."""
        return self.start + self.num_tokens - len(self.draft_token_ids) == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_batched_tokens: int = 0


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0


# How many waiting long prompts one step looks past for short ones behind them.
_MAX_PASSED = 32


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        fairness: VirtualTokenCounter | None = None,
        long_prefill_token_threshold: int = 0,
    ) -> None:
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # 0: off (a prefill takes all the budget left; one request admitted after another).
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.fairness = fairness or VirtualTokenCounter()
        self.waiting = WaitingQueue(self.fairness)
        # Sorted by (tier, admission order): the head is served first, the tail preempted first.
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()
        self._admissions = 0
        # Head-room kept free when admitting beside running sequences, so that new admissions do
        # not immediately force preemptions of sequences that are decoding.
        self._watermark = max(1, block_manager.num_blocks // 100)

    # -- request lifecycle ------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        needed = self.blocks.blocks_for(seq.max_total_tokens)
        if needed > self.blocks.num_blocks:
            raise RequestTooLargeError(
                f"request needs {needed} KV blocks for {seq.max_total_tokens} tokens but the pool holds "
                f"{self.blocks.num_blocks} blocks of {self.blocks.block_size}; shorten the prompt or max_tokens"
            )
        seq.status = SequenceStatus.WAITING
        self.fairness.arrive(seq.tenant)
        self.waiting.push(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove seq (finished or aborted) wherever it is and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.release(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            return
        seq.status = SequenceStatus.FINISHED
        self.fairness.depart(seq.tenant)

    def prompt_tokens_by_tier(self) -> dict[str, int]:
        """Prompt tokens still to prefill per tier: the waiting requests' and what is left of the
        prefills in progress (with partial prefills, a long one lasts many steps)."""
        tokens = self.waiting.tokens_by_tier()
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1:
                tokens[seq.priority] += seq.num_uncomputed_tokens
        return tokens

    def has_unfinished(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self, proposals: Mapping[Sequence, list[int]] | None = None) -> SchedulerOutput:
        """`proposals`: speculative tokens to verify after a running sequence's decode token. They
        are opportunistic: trimmed to the budget and the free blocks left once every decode has its
        token, and never the cause of a preemption."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        running = self.running
        # Decodes first, so a long prompt being prefilled never stalls the sequences admitted after it.
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            if seq.num_uncomputed_tokens > 1:  # a prefill in progress: served from what is left
                i += 1
                continue
            while self.blocks.blocks_needed(seq, seq.num_tokens) > self.blocks.num_free_blocks:
                victim = running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            self.blocks.grow(seq, seq.num_tokens)
            self._take(out, seq, 1)
            budget -= 1
            i += 1
        if proposals:
            budget = self._add_drafts(out, proposals, budget)
        long_in_progress = False
        for seq in running:
            if seq.num_uncomputed_tokens > 1:
                long_in_progress = long_in_progress or self._is_long(seq.num_uncomputed_tokens)
                if budget == 0:
                    continue
                n = self._chunk(seq.num_uncomputed_tokens, budget)
                # Admission reserved blocks for every known token, so a prefill chunk never allocates.
                assert self.blocks.blocks_needed(seq, seq.num_computed_tokens + n) == 0
                self._take(out, seq, n)
                budget -= n
        if not out.preempted:
            self._admit(out, budget, long_in_progress)
        return out

    def _is_long(self, uncomputed: int) -> bool:
        """More prompt than one step's chunk: it stays in progress after this step."""
        return 0 < self.long_prefill_token_threshold < uncomputed

    def _chunk(self, uncomputed: int, budget: int) -> int:
        n = min(uncomputed, budget)
        return min(n, self.long_prefill_token_threshold) if self.long_prefill_token_threshold else n

    def _add_drafts(self, out: SchedulerOutput, proposals: Mapping[Sequence, list[int]], budget: int) -> int:
        for chunk in out.chunks:
            drafts = proposals.get(chunk.seq)
            if not drafts or chunk.seq.status is not SequenceStatus.RUNNING:
                continue
            seq = chunk.seq
            k = min(len(drafts), budget)
            # KV is written for the decode token and the k proposals: num_tokens + k positions.
            while k and self.blocks.blocks_needed(seq, seq.num_tokens + k) > self.blocks.num_free_blocks:
                k -= 1
            if k == 0:
                continue
            self.blocks.grow(seq, seq.num_tokens + k)
            chunk.draft_token_ids = list(drafts[:k])
            chunk.num_tokens += k
            out.num_batched_tokens += k
            budget -= k
        return budget

    def _admit(self, out: SchedulerOutput, budget: int, long_in_progress: bool) -> None:
        bs = self.blocks.block_size
        passed: set[Sequence] = set()  # long requests waiting for the long prefill in progress
        while budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.peek(passed)
            if seq is None:
                break
            hit = self.blocks.prefix_hit(seq)
            long = self._is_long(seq.num_tokens - len(hit) * bs)
            if long and long_in_progress:
                if len(passed) == _MAX_PASSED:
                    break  # a step's admission stays cheap however many long prompts queue
                passed.add(seq)
                continue
            reserve = self._watermark if self.running else 0
            if self.blocks.admission_cost(seq, hit) + reserve > self.blocks.num_free_blocks:
                break  # head-of-line waits: skipping it could starve large requests
            self.waiting.remove(seq)
            self.blocks.admit(seq, hit)
            if not seq.ever_admitted:
                # Counted once per request: recomputation after preemption is not a client query.
                seq.ever_admitted = True
                seq.num_cached_prompt_tokens = len(hit) * bs
                self.stats.prefix_cache_query_tokens += seq.num_prompt_tokens
                self.stats.prefix_cache_hit_tokens += len(hit) * bs
            seq.status = SequenceStatus.RUNNING
            seq.admitted_order = self._admissions
            self._admissions += 1
            bisect.insort(self.running, seq, key=lambda s: (s.rank, s.admitted_order))
            n = self._chunk(seq.num_uncomputed_tokens, budget)
            self._take(out, seq, n)
            budget -= n
            long_in_progress = long_in_progress or long

    def _take(self, out: SchedulerOutput, seq: Sequence, n: int) -> None:
        start = seq.num_computed_tokens
        out.chunks.append(ScheduledChunk(seq, start, n))
        out.num_batched_tokens += n
        self._charge(seq, start, start + n)

    def _charge(self, seq: Sequence, start: int, end: int) -> None:
        # Fairness charges each token position once: recomputation after preemption is free.
        first_new = max(start, seq.num_charged_tokens)
        if end > first_new:
            prompt = max(0, min(end, seq.num_prompt_tokens) - first_new)
            self.fairness.charge(seq.tenant, prompt, end - first_new - prompt)
            seq.num_charged_tokens = end

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        seq.status = SequenceStatus.WAITING
        self.stats.num_preemptions += 1
        self.waiting.push(seq, front=True)

    def step_done(self, out: SchedulerOutput, num_accepted: SequenceOf[int] | None = None) -> None:
        """Record the KV the model just wrote and publish newly full blocks to the prefix cache.

        `num_accepted[i]`: how many of chunk i's proposed tokens were accepted (needed when any
        chunk speculated). Rejected proposals' KV is rolled back: those positions no longer count
        as computed (the next step overwrites them), and blocks that held only rejected positions
        go back to the pool. Accepted ones are charged to the tenant as output tokens.
        """
        for i, chunk in enumerate(out.chunks):
            seq = chunk.seq
            end = chunk.start + chunk.num_tokens
            if chunk.draft_token_ids:
                assert num_accepted is not None
                accepted = num_accepted[i]
                assert 0 <= accepted <= len(chunk.draft_token_ids)
                end -= len(chunk.draft_token_ids) - accepted
                # The next step writes KV up to the token this verification emits: end + 1 tokens.
                self.blocks.shrink(seq, end + 1)
                self._charge(seq, chunk.start + 1, end)
            seq.num_computed_tokens = end
            self.blocks.cache_computed(seq)

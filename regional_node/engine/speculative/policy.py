"""When to speculate, and what speculation achieved (vLLM's spec_decode counters).

Two back-off rules (README, "Speculative decoding", has the measurements behind the defaults):
- per step: with more than `max_batch_size` decoding sequences nobody speculates: verifying k
  extra tokens per sequence costs compute a large batch no longer has spare;
- per sequence: once a sequence has had at least `_WINDOW_TOKENS` tokens proposed recently and
  fewer than `min_acceptance_rate` of them were accepted, it stops proposing for a cool-down that
  doubles each time it backs off again (32, 64, ... 1024 generated tokens), then tries again.
  Measured on open-ended text (benchmarks/speculative.py): judging after 12 tokens with a first
  cool-down of 16 left batch-1 decode at 0.92-0.96x of speculation off (partly load noise); two failed
  verifications of 4 tokens are evidence enough.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from regional_node.engine.config import SpeculativeConfig
from regional_node.engine.model_runner import SamplingRequest
from regional_node.engine.scheduler import SchedulerOutput
from regional_node.engine.sequence import Sequence
from regional_node.engine.speculative.draft import DraftProposer, DraftRequest
from regional_node.engine.speculative.ngram import propose_ngram
from regional_node.engine.speculative.proposal import Proposal

# Recent verifications a sequence's acceptance is judged on, and the proposed tokens they must
# hold before it is judged at all (a few unlucky proposals are no evidence).
_WINDOW_STEPS = 8
_WINDOW_TOKENS = 8
_FIRST_COOL_DOWN = 32
_MAX_COOL_DOWN = 1024


@dataclass
class SequenceSpeculation:
    """One sequence's recent acceptance and its back-off."""

    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=_WINDOW_STEPS))
    resume_at: int = 0  # number of output tokens before which it does not propose
    cool_down: int = _FIRST_COOL_DOWN


@dataclass
class SpecDecodeStats:
    """Totals since start, named as vLLM's metrics (vllm:spec_decode_*)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification (accepted proposals + the target's own token)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def counters(self) -> dict[str, Any]:
        """The spec_decode_* keys of a node's stats(), named as vLLM's counters
        (vllm:spec_decode_*) so dashboards carry over, whichever engine the node runs."""
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "spec_decode_acceptance_rate": self.acceptance_rate,
            "spec_decode_mean_acceptance_length": self.mean_acceptance_length,
        }


class SpeculationPolicy:
    """Decides which sequences speculate, asks the configured proposer (n-gram lookup, or the
    draft model when `draft` is given) for their proposals, and keeps the counters."""

    def __init__(self, config: SpeculativeConfig, draft: DraftProposer | None = None) -> None:
        assert (draft is not None) == (config.method == "draft")
        self.config = config
        self.draft = draft
        self.stats = SpecDecodeStats(num_accepted_tokens_per_pos=[0] * config.num_speculative_tokens)
        self._sequences: dict[str, SequenceSpeculation] = {}

    def propose(
        self, running: list[Sequence], allowed: Mapping[str, SamplingRequest]
    ) -> dict[Sequence, Proposal]:
        """Proposals for the running sequences that decode next step; `allowed` holds how the
        requests that permit speculation sample, by request id (the others opted out)."""
        config = self.config
        decoding = [s for s in running if s.num_uncomputed_tokens == 1]
        if len(decoding) > config.max_batch_size:
            return {}
        proposals = {}
        drafting = []
        for seq in decoding:
            sampling = allowed.get(seq.request_id)
            if sampling is None:
                continue
            state = self._sequences.setdefault(seq.request_id, SequenceSpeculation())
            if seq.num_output_tokens < state.resume_at:
                continue
            # Never propose past max_tokens: the verification emits up to k + 1 tokens.
            k = min(config.num_speculative_tokens, seq.max_tokens - seq.num_output_tokens - 1)
            if k < 1:
                continue
            if self.draft is not None:
                drafting.append(DraftRequest(seq, k, sampling))
                continue
            drafts = propose_ngram(
                seq.token_ids, k=k, min_n=config.prompt_lookup_min, max_n=config.prompt_lookup_max
            )
            if drafts:
                proposals[seq] = Proposal(drafts)
        if drafting:
            assert self.draft is not None
            proposals.update(self.draft.propose(drafting))
        return proposals

    def step_done(self, out: SchedulerOutput, num_accepted: list[int]) -> None:
        """After the target's step: the draft cache follows the verifications and preemptions."""
        if self.draft is not None:
            self.draft.step_done(out, num_accepted)

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """A verification's outcome, before its tokens are appended."""
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += num_drafted
        stats.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            stats.num_accepted_tokens_per_pos[pos] += 1
        state = self._sequences.setdefault(seq.request_id, SequenceSpeculation())
        state.recent.append((num_drafted, num_accepted))
        drafted = sum(d for d, _ in state.recent)
        accepted = sum(a for _, a in state.recent)
        if drafted >= _WINDOW_TOKENS and accepted < self.config.min_acceptance_rate * drafted:
            state.resume_at = seq.num_output_tokens + 1 + num_accepted + state.cool_down
            state.cool_down = min(2 * state.cool_down, _MAX_COOL_DOWN)
            state.recent.clear()

    def forget(self, request_id: str) -> None:
        """The request finished or was aborted: drop its state and free its draft blocks."""
        self._sequences.pop(request_id, None)
        if self.draft is not None:
            self.draft.release(request_id)

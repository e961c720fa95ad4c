"""The synchronous engine: requests in, one scheduled model step at a time, deltas out.

Not thread-safe: one thread drives it (AsyncEngine owns that thread in the node server).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence as SequenceOf
from pathlib import Path
from typing import Any, Protocol

import torch

from regional_node.engine.block_manager import BlockManager
from regional_node.engine.config import EngineConfig, ModelConfig
from regional_node.engine.drain import DrainMeter
from regional_node.engine.errors import EngineError, InvalidRequestError, StepFailedError
from regional_node.engine.fairness import VirtualTokenCounter
from regional_node.engine.loading import load_checkpoint
from regional_node.engine.model_runner import ModelRunner, SamplingRequest
from regional_node.engine.output_processor import RequestState, append_tokens
from regional_node.engine.outputs import Finish, RequestDelta, RequestOutput
from regional_node.engine.request_intake import RequestIntake
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.scheduler import ScheduledChunk, Scheduler
from regional_node.engine.sequence import Sequence
from regional_node.engine.speculative.draft import DraftProposer
from regional_node.engine.speculative.policy import SpeculationPolicy
from regional_node.engine.speculative.proposal import Proposal
from regional_node.engine.tokenizer import Tokenizer


class StepObserver(Protocol):
    def step_done(self, chunks: list[ScheduledChunk], started: float, ended: float) -> None: ...


class LLMEngine:
    def __init__(
        self,
        *,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        runner: ModelRunner,
        num_kv_blocks: int,
        max_model_len: int,
        tokenizer: Tokenizer | None,
        eos_token_ids: tuple[int, ...],
        draft_runner: ModelRunner | None = None,
    ) -> None:
        """`draft_runner`: the draft model (speculative method `draft`), with a KV pool of
        `num_kv_blocks` blocks of its own."""
        self.model_config = model_config
        self.engine_config = engine_config
        self.runner = runner
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.block_manager = BlockManager(
            num_kv_blocks, engine_config.block_size, engine_config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=engine_config.max_num_seqs,
            max_num_batched_tokens=engine_config.max_num_batched_tokens,
            long_prefill_token_threshold=engine_config.long_prefill_token_threshold,
            fairness=VirtualTokenCounter(
                engine_config.fairness_prompt_weight, engine_config.fairness_output_weight
            ),
        )
        self._intake = RequestIntake(
            vocab_size=model_config.vocab_size,
            max_model_len=max_model_len,
            tokenizer=tokenizer,
            eos_token_ids=eos_token_ids,
            device=runner.device,
        )
        spec = engine_config.speculative
        self.speculation = None
        if spec is not None:
            draft = None
            if draft_runner is not None:
                draft = DraftProposer(
                    draft_runner,
                    num_blocks=num_kv_blocks,
                    block_size=engine_config.block_size,
                    enable_prefix_caching=engine_config.enable_prefix_caching,
                    max_num_batched_tokens=engine_config.max_num_batched_tokens,
                )
            self.speculation = SpeculationPolicy(spec, draft)
        self._requests: dict[str, RequestState] = {}
        # Abort notices, and requests their continuation tokens already ended: handed out by the
        # next step().
        self._pending: list[RequestDelta] = []
        self._arrivals = itertools.count()
        self._generate_ids = itertools.count()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # Tokens computed per second, recently: how fast the waiting queue drains.
        self.drain = DrainMeter()
        # Told about every step's chunks and timing, on the step thread (the node's utilization
        # meters, regional_node/utilization); they must be quick and never raise.
        self.step_observers: list[StepObserver] = []

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        block_size: int = 16,
        num_kv_blocks: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        enable_prefix_caching: bool = True,
        **more: Any,
    ) -> LLMEngine:
        """Load a Hugging Face checkpoint folder; `more` takes any other EngineConfig option."""
        config = EngineConfig.from_options(
            device=device,
            dtype=dtype,
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            **more,
        )
        return cls(**vars(load_checkpoint(Path(path), config)))

    # -- requests -------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: list[int] | str,
        params: SamplingParams,
        *,
        tenant: str = "default",
        priority: str = "interactive",
        cache_salt: str | None = None,
        continuation_token_ids: list[int] | None = None,
    ) -> None:
        """Queue a request; raises an InvalidRequestError / RequestTooLargeError subclass at once if bad.

        `continuation_token_ids` continue a stream: tokens already generated (whose text the
        client has), prefilled as prompt; generation goes on after them (see request_intake).
        """
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        state, finish = self._intake.build(
            request_id,
            prompt,
            params,
            tenant=tenant,
            priority=priority,
            cache_salt=cache_salt,
            continuation_token_ids=continuation_token_ids,
            arrival=next(self._arrivals),
        )
        state.arrival_time = time.monotonic()
        if finish is not None:
            # The carried tokens already end it: reported by the next step(), like an abort notice,
            # and never scheduled (no blocks, nothing to generate).
            self._pending.append(state.delta([], "", [], finish))
            return
        self.scheduler.add(state.seq)  # raises RequestTooLargeError before anything is recorded
        self._requests[request_id] = state
        self.prompt_tokens_total += state.seq.num_prompt_tokens

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its blocks now; the next step() reports it with finish_reason "abort"."""
        state = self._requests.get(request_id)
        if state is None:
            return
        self._finish(state)
        self._pending.append(state.delta([], "", [], Finish("abort")))

    def _finish(self, state: RequestState) -> None:
        self.scheduler.finish(state.seq)
        del self._requests[state.seq.request_id]
        if self.speculation is not None:
            self.speculation.forget(state.seq.request_id)

    def abort_all(self) -> list[str]:
        """Abort every request without abort notices (the caller reports them); returns their ids."""
        # Requests already aborted but not yet reported count too: their callers still wait for an end.
        request_ids = [d.request_id for d in self._pending] + list(self._requests)
        for request_id in list(self._requests):
            self.abort_request(request_id)
        self._pending.clear()
        return request_ids

    def has_unfinished_requests(self) -> bool:
        return bool(self._pending) or self.scheduler.has_unfinished()

    # -- one iteration --------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        started = time.monotonic()
        proposals: dict[Sequence, Proposal] = {}
        if self.speculation is not None:
            allowed = {
                rid: (state.params, state.generator)
                for rid, state in self._requests.items()
                if state.params.speculative
            }
            proposals = self.speculation.propose(self.scheduler.running, allowed)
        if proposals:
            out = self.scheduler.schedule({seq: p.token_ids for seq, p in proposals.items()})
        else:
            out = self.scheduler.schedule()
        if not out.chunks:
            deltas, self._pending = self._pending, []
            return deltas
        sampling: list[SamplingRequest | None] = []
        now = time.monotonic()
        for chunk in out.chunks:
            state = self._requests[chunk.seq.request_id]
            state.mark_scheduled(now)
            sampling.append((state.params, state.generator) if chunk.completes else None)
        draft_probs = None
        if any(p.probs is not None for p in proposals.values()):
            # The proposals' q rows, cut to the proposals the scheduler kept.
            draft_probs = [_kept_probs(proposals.get(chunk.seq), chunk) for chunk in out.chunks]
        try:
            results = self.runner.execute(out.chunks, sampling, draft_probs)
        except Exception as exc:
            if self.speculation is not None:
                # Nothing was verified: the draft cache forgets every proposal (and what preemption freed).
                self.speculation.step_done(out, [0] * len(out.chunks))
            failed = [chunk.seq.request_id for chunk in out.chunks]
            for request_id in failed:
                self._finish(self._requests[request_id])
            raise StepFailedError(f"model step failed: {exc!r}", failed) from exc
        num_accepted = [len(r) - 1 if r is not None else 0 for r in results]
        self.scheduler.step_done(out, num_accepted)
        if self.speculation is not None:
            self.speculation.step_done(out, num_accepted)
        ended = time.monotonic()
        deltas: list[RequestDelta] = []
        finished = 0
        for chunk, result, accepted in zip(out.chunks, results, num_accepted, strict=True):
            if result is None:
                continue
            if chunk.draft_token_ids and self.speculation is not None:
                self.speculation.record(chunk.seq, len(chunk.draft_token_ids), accepted)
            state = self._requests[chunk.seq.request_id]
            delta = append_tokens(state, result)
            if chunk.draft_token_ids:
                delta.drafts = [(len(chunk.draft_token_ids), accepted)]
            self.generation_tokens_total += len(delta.new_token_ids)
            if delta.finished:
                self._finish(state)
                finished += 1
            deltas.append(delta)
        self.drain.record(started, ended, out.num_batched_tokens, finished)
        for observer in self.step_observers:
            observer.step_done(out.chunks, started, ended)
        # Abort notices are taken only now, so a step that raises leaves them for the next one.
        pending, self._pending = self._pending, []
        return pending + deltas

    # -- convenience ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: SequenceOf[list[int] | str],
        sampling_params: SamplingParams | SequenceOf[SamplingParams] | None = None,
        *,
        tenants: SequenceOf[str] | None = None,
        priorities: SequenceOf[str] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; one RequestOutput per prompt, in order. Drives step() itself,
        so do not mix with a concurrently running AsyncEngine."""
        if isinstance(prompts, str):
            prompts = [prompts]  # one text prompt, not a list of one-character prompts
        n = len(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * n
        else:
            params_list = list(sampling_params)
        for name, values in (
            ("sampling_params", params_list),
            ("tenants", tenants),
            ("priorities", priorities),
        ):
            if values is not None and len(values) != n:
                raise InvalidRequestError(f"{name} has {len(values)} entries for {n} prompts", name)
        results: dict[str, RequestOutput] = {}
        try:
            for i, prompt in enumerate(prompts):
                request_id = f"generate-{next(self._generate_ids)}"
                self.add_request(
                    request_id,
                    prompt,
                    params_list[i],
                    tenant=tenants[i] if tenants is not None else "default",
                    priority=priorities[i] if priorities is not None else "interactive",
                )
                seq = self._requests[request_id].seq
                results[request_id] = RequestOutput(
                    request_id,
                    list(seq.token_ids),
                    prompt_tokens=seq.num_prompt_tokens,
                    cached_tokens=seq.num_cached_prompt_tokens,
                )
            remaining = set(results)
            while remaining:
                if not self.has_unfinished_requests():
                    raise EngineError(f"internal error: requests {sorted(remaining)} were lost")
                for delta in self.step():
                    out = results.get(delta.request_id)
                    if out is not None:
                        out.add(delta)
                        if delta.finished:
                            remaining.discard(delta.request_id)
        except BaseException:
            for request_id in results:
                self.abort_request(request_id)
            self._pending = [d for d in self._pending if d.request_id not in results]
            raise
        return list(results.values())

    def stats(self) -> dict[str, Any]:
        bm, sched = self.block_manager, self.scheduler
        query, hit = sched.stats.prefix_cache_query_tokens, sched.stats.prefix_cache_hit_tokens
        prompt_tokens = sched.prompt_tokens_by_tier()
        return {
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_used_blocks,
            "kv_blocks_cached": bm.num_cached_blocks,
            "kv_cache_usage": bm.num_used_blocks / bm.num_blocks,
            "num_running": len(sched.running),
            "num_waiting": len(sched.waiting),
            "waiting_tokens": sum(prompt_tokens.values()),
            # Prefills in progress count as waiting: the estimate queues new prompts behind them.
            "waiting_tokens_by_tier": prompt_tokens,
            "waiting_requests_by_tier": sched.waiting.requests_by_tier(),
            # time.monotonic() of the oldest waiting request's arrival per tier: readers turn it
            # into an age at read time, so a stalled step loop shows an age that keeps growing.
            "oldest_waiting_by_tier": self._oldest_waiting_by_tier(),
            # What admission's time-to-first-token estimate needs (admission.py reads these and
            # the drain meter through AsyncEngine._queue_state).
            "max_num_seqs": self.engine_config.max_num_seqs,
            "block_size": self.engine_config.block_size,
            "max_num_batched_tokens": self.engine_config.max_num_batched_tokens,
            "long_prefill_token_threshold": self.engine_config.long_prefill_token_threshold,
            "num_preemptions": sched.stats.num_preemptions,
            "prefix_cache_query_tokens": query,
            "prefix_cache_hit_tokens": hit,
            "prefix_cache_hit_rate": hit / query if query else 0.0,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            **self._speculation_stats(),
        }

    def _speculation_stats(self) -> dict[str, Any]:
        return {} if self.speculation is None else self.speculation.stats.counters()

    def _oldest_waiting_by_tier(self) -> dict[str, float]:
        oldest: dict[str, float] = {}
        for seq in self.scheduler.waiting:
            state = self._requests.get(seq.request_id)
            if state is not None and state.arrival_time < oldest.get(seq.priority, float("inf")):
                oldest[seq.priority] = state.arrival_time
        return oldest


def _kept_probs(proposal: Proposal | None, chunk: ScheduledChunk) -> torch.Tensor | None:
    if proposal is None or proposal.probs is None or not chunk.draft_token_ids:
        return None
    return proposal.probs[: len(chunk.draft_token_ids)]

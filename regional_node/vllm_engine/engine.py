"""`VllmEngine`: the node's NodeEngine over vLLM's V1 `AsyncLLM`.

vLLM computes the tokens; everything the client sees of them is ours. Each request goes through
our RequestIntake (the same validation, errors and continuation replay as our engine), vLLM
generates token ids only (no tokenizer of its own, `skip_tokenizer_init`), and our output
processor turns them into text, applies stop strings and decides the finish, exactly as on a node
running our engine. So a stream broken on one engine continues on the other with identical text,
and the gateway cannot tell them apart.

What the gateway sends maps onto vLLM as: tier → priority (scheduling_policy "priority",
interactive before batch); the tenant's cache salt → `cache_salt` (prefix-cache isolation);
seed, temperature, top-p, top-k → vLLM's sampling (a seeded request is reproducible on vLLM, not
across engines: the random draws differ); stop and EOS tokens → `stop_token_ids`; stop strings
are matched here and end the vLLM request by abort; logprobs are vLLM's processed logprobs (after
temperature and top-k/p, as ours); a continuation's tokens are appended to the prompt.

The node's queue bounds (admission.py) apply unchanged: a request counts as waiting, per tier,
from its arrival until vLLM's first output for it. /load and /metrics read vLLM's own scheduler
stats (KV use, running and waiting requests, prefix-cache and preemption totals; stats.py).

vLLM runs its engine core in a child process started with multiprocessing's spawn: the program
that builds a VllmEngine needs the `if __name__ == "__main__"` guard.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from regional_node.cpu_share import CpuShare, child_processes, format_cpu_list
from regional_node.engine import admission
from regional_node.engine.admission import QueueLimits, QueueState
from regional_node.engine.drain import DrainMeter
from regional_node.engine.errors import EngineConfigError, EngineError, InvalidRequestError
from regional_node.engine.kv_pool import DEFAULT_FRACTION, available_memory_bytes
from regional_node.engine.output_processor import RequestState, append_token
from regional_node.engine.outputs import Alternatives, Finish, RequestDelta
from regional_node.engine.request_intake import RequestIntake
from regional_node.engine.sampler import SampledToken
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.sequence import PRIORITY_RANK
from regional_node.engine.tokenizer import Tokenizer, checkpoint_eos_token_ids
from regional_node.vllm_engine.stats import EngineTotals, stat_logger_factory

if TYPE_CHECKING:
    from regional_node.server.config import EngineSettings

# Our engine's option names that mean something else (or nothing) to vLLM's engine.
_OURS_ONLY = ("attention_backend", "cuda_graphs", "fairness_prompt_weight", "fairness_output_weight")


def engine_args(path: str, settings: EngineSettings) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments for a model's `engine:` settings. `options` are vLLM's own
    engine arguments (tensor_parallel_size, gpu_memory_utilization, enforce_eager, ...)."""
    options = dict(settings.options)
    ours = sorted(set(options) & set(_OURS_ONLY))
    if ours:
        raise EngineConfigError(
            f"engine option(s) {', '.join(ours)} are our engine's; with engine: vllm, vLLM picks its own kernels"
        )
    args: dict[str, Any] = {
        "model": path,
        # Prompts arrive as token ids and text is made here (our tokenizer, stop strings).
        "skip_tokenizer_init": True,
        "dtype": settings.dtype,
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "scheduling_policy": "priority",
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": False,  # the stats feed /load and /metrics
    }
    if settings.speculative is not None:
        # vLLM's own speculative decoding, same method and sizes (its back-off rules are its own).
        spec = settings.speculative
        args["speculative_config"] = {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "prompt_lookup_min": spec.prompt_lookup_min,
            "prompt_lookup_max": spec.prompt_lookup_max,
        }
        # Each request's verify steps, (proposed, accepted) per step, on its finishing output:
        # what RequestDelta.drafts reports on our engine (Server-Timing, the trace's decode span).
        args["per_request_spec_decode_metrics"] = "detailed"
    if settings.block_size is not None:
        args["block_size"] = settings.block_size
    if settings.num_kv_blocks is not None:
        args["num_gpu_blocks_override"] = settings.num_kv_blocks
    if settings.device == "cpu" and not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(options):
        # Our engine's CPU default (a share of the host's available memory). vLLM's own default
        # reserves 92% of the host's total memory and refuses to start when less is free.
        fraction = DEFAULT_FRACTION["cpu"]
        args["kv_cache_memory_bytes"] = int(available_memory_bytes(torch.device("cpu")) * fraction)
    return {**args, **options}


class VllmEngine:
    def __init__(
        self,
        llm: Any,
        *,
        path: Path,
        limits: QueueLimits | None,
        totals: EngineTotals,
        drain: DrainMeter,
    ) -> None:
        """`llm`: a started vLLM AsyncLLM whose stat logger records into `totals` and `drain`
        (see from_settings)."""
        config = llm.vllm_config
        self._llm = llm
        self.limits = limits or QueueLimits()
        self._tokenizer = Tokenizer.from_pretrained(path)
        eos = self._tokenizer.eos_token_ids if self._tokenizer is not None else checkpoint_eos_token_ids(path)
        self._max_model_len = int(config.model_config.max_model_len)
        self._block_size = int(config.cache_config.block_size)
        self._num_blocks = int(config.cache_config.num_gpu_blocks or 0)
        self._intake = RequestIntake(
            vocab_size=int(config.model_config.get_vocab_size()),
            max_model_len=self._max_model_len,
            tokenizer=self._tokenizer,
            eos_token_ids=eos,
            # Where a sampled request's generator would live; vLLM samples with its own.
            device=torch.device("cpu"),
        )
        self.totals = totals
        self.drain = drain
        self._active: set[str] = set()
        # Per tier, from a request's arrival until vLLM's first output for it: its prompt tokens,
        # and the requests.
        self._waiting: dict[str, int] = dict.fromkeys(PRIORITY_RANK, 0)
        self._waiting_requests: dict[str, int] = dict.fromkeys(PRIORITY_RANK, 0)
        # Request id -> (tier, time.monotonic() it was handed to vLLM), until its first output.
        self._waiting_since: dict[str, tuple[str, float]] = {}
        scheduler = config.scheduler_config
        self._max_num_seqs = int(scheduler.max_num_seqs)
        self._max_num_batched_tokens = int(scheduler.max_num_batched_tokens)
        self._running = False
        self._arrivals = itertools.count()
        self._speculates = config.speculative_config is not None

    @classmethod
    def from_settings(
        cls,
        path: str | Path,
        settings: EngineSettings,
        limits: QueueLimits | None = None,
        *,
        cpu_share: CpuShare | None = None,
    ) -> VllmEngine:
        """Start vLLM's engine for the checkpoint at `path` (blocking: loads the weights), its
        processes confined to `cpu_share` (None: as vLLM places them itself)."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineConfigError(
                "engine: vllm needs vLLM, which is not installed "
                "(CPU: pip install 'meridian[vllm]'; GPU: pip install vllm)"
            ) from exc
        kwargs = engine_args(str(path), settings)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as exc:
            raise EngineConfigError(f"engine: vllm: {exc}") from exc
        # vLLM's stat logger exists before the VllmEngine does: both share these.
        totals, drain = EngineTotals(), DrainMeter()
        with _omp_binding(cpu_share, settings.device, kwargs):
            llm = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(totals, drain)])
        if cpu_share is not None:
            # vLLM's engine core and its worker (and what they started) are this process's
            # descendants; the API's own threads stay where they are.
            for pid in child_processes(os.getpid()):
                cpu_share.place(pid)
        return cls(llm, path=Path(path), limits=limits, totals=totals, drain=drain)

    # -- NodeEngine -------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def kv_block_size(self) -> int:
        return self._block_size

    async def start(self) -> None:
        self._running = True

    async def shutdown(self) -> None:
        self._running = False
        # Ends every request's vLLM stream (their consumers get an EngineError) and the child process.
        self._llm.shutdown()

    async def generate(
        self,
        prompt: list[int] | str,
        params: SamplingParams,
        *,
        request_id: str | None = None,
        tenant: str = "default",
        priority: str = "interactive",
        cache_salt: str | None = None,
        continuation_token_ids: list[int] | None = None,
    ) -> AsyncIterator[RequestDelta]:
        if not self._running:
            raise EngineError("the vLLM engine is not running")
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._active:
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
        if finish is not None:  # the carried tokens already end it: nothing to generate
            yield state.delta([], "", [], finish)
            return
        tokens = state.seq.num_prompt_tokens
        admission.check(self.limits, self._queue_state(), priority, tokens)
        self._active.add(request_id)
        self._waiting[priority] += tokens
        self._waiting_requests[priority] += 1
        self._waiting_since[request_id] = (priority, time.monotonic())
        waiting, done = True, False
        inputs: dict[str, Any] = {"prompt_token_ids": list(state.seq.token_ids)}
        if cache_salt:
            inputs["cache_salt"] = cache_salt
        stream = self._llm.generate(inputs, _vllm_params(state), request_id, priority=PRIORITY_RANK[priority])
        try:
            async with contextlib.aclosing(stream):
                async for output in stream:
                    if waiting:
                        self._waiting[priority] -= tokens
                        self._waiting_requests[priority] -= 1
                        self._waiting_since.pop(request_id, None)
                        waiting = False
                    delta = _delta(state, output)
                    done = delta.finished
                    if delta.new_token_ids or done:
                        yield delta
                    if done:
                        return
        except EngineError:
            raise
        except Exception as exc:  # vLLM's engine died or refused the request
            raise EngineError(f"vLLM: {exc!r}") from exc
        finally:
            if waiting:
                self._waiting[priority] -= tokens
                self._waiting_requests[priority] -= 1
                self._waiting_since.pop(request_id, None)
            self._active.discard(request_id)
            if not done:
                with contextlib.suppress(Exception):
                    await self._llm.abort(request_id)
        raise EngineError("vLLM ended the request without a finish")

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    def _queue_state(self) -> QueueState:
        # vLLM reports each engine iteration to the stat logger (stats.py), which fits the step
        # cost; running is what is in flight here past its first output.
        waiting = sum(self._waiting_requests.values())
        return QueueState(
            dict(self._waiting),
            waiting_requests=dict(self._waiting_requests),
            drain_tokens_per_s=self.drain.rate(),
            step_cost=self.drain.step_cost(),
            max_num_batched_tokens=self._max_num_batched_tokens,
            max_num_seqs=self._max_num_seqs,
            finish_rate=self.drain.slot_rate(),
            running=max(len(self._active) - waiting, 0),
        )

    def stats(self) -> dict[str, Any]:
        t = self.totals
        waiting = dict(self._waiting)
        query, hit = t.prefix_cache_query_tokens, t.prefix_cache_hit_tokens
        # vLLM sends its scheduler stats with each engine step's output, so they are as of the
        # last step: an abort that leaves the engine idle runs no further step, and the stats
        # would say forever that the aborted request runs. Our own in-flight requests bound them
        # (an idle engine holds no KV blocks: freed prefix-cache blocks count as free in vLLM).
        in_flight = len(self._active)
        running = min(t.num_running, in_flight)
        usage = t.kv_cache_usage if in_flight else 0.0
        return {
            "kv_blocks_total": self._num_blocks,
            "kv_blocks_used": round(usage * self._num_blocks),
            "kv_cache_usage": usage,
            "num_running": running,
            "num_waiting": min(t.num_waiting, in_flight - running),
            "waiting_tokens": sum(waiting.values()),
            "num_preemptions": t.num_preemptions,
            "prefix_cache_query_tokens": query,
            "prefix_cache_hit_tokens": hit,
            "prefix_cache_hit_rate": hit / query if query else 0.0,
            "prompt_tokens_total": t.prompt_tokens_total,
            "generation_tokens_total": t.generation_tokens_total,
            "block_size": self._block_size,
            # Our engine's oldest waiting arrival per tier; here "waiting" lasts until vLLM's first
            # output (its queue and the prefill: vLLM does not say when it first schedules one).
            "oldest_waiting_by_tier": self._oldest_waiting_by_tier(),
            **admission.report(self._queue_state(), self.limits),
            **(t.speculation() if self._speculates else {}),
        }

    def _oldest_waiting_by_tier(self) -> dict[str, float]:
        oldest: dict[str, float] = {}
        for tier, since in list(self._waiting_since.values()):
            oldest[tier] = min(since, oldest.get(tier, since))
        return oldest


@contextlib.contextmanager
def _omp_binding(share: CpuShare | None, device: str, kwargs: dict[str, Any]) -> Iterator[None]:
    """While vLLM starts: on CPU with one worker, bind its OpenMP threads to the share's first
    `threads` cores (vLLM's own `auto` binding takes every core but one and leaves its engine-core
    process unbound). vLLM's processes read it when they start; the node's own env is restored."""
    single = all(int(kwargs.get(key) or 1) == 1 for key in ("tensor_parallel_size", "pipeline_parallel_size"))
    if share is None or device != "cpu" or not single:
        yield
        return
    name = "VLLM_CPU_OMP_THREADS_BIND"
    before = os.environ.get(name)
    os.environ[name] = format_cpu_list(sorted(share.cpus)[: share.threads])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _vllm_params(state: RequestState) -> Any:
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    p = state.params
    return VllmSamplingParams(
        max_tokens=p.max_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,  # 0: off, in both
        seed=p.seed,
        # Our stop tokens (EOS unless ignore_eos, and stop_token_ids), so vLLM stops where we do.
        ignore_eos=True,
        stop_token_ids=sorted(state.stop_token_ids),
        # vLLM reports the sampled token's logprob and its top-k alternatives (ranks 1..k).
        logprobs=p.top_logprobs,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


def _alternatives(entry: Any, count: int) -> Alternatives:
    """vLLM's top-`count` of one position ({token id: Logprob(logprob, rank)}, the sampled token's
    entry among them whatever its rank), most likely first; tokens its top-k/top-p cut (-inf) are
    not alternatives, as in our sampler."""
    if not entry or not count:
        return ()
    ranked = sorted((item.rank, token, float(item.logprob)) for token, item in entry.items())
    return tuple((token, value) for rank, token, value in ranked if rank <= count and value != -math.inf)


def _delta(state: RequestState, output: Any) -> RequestDelta:
    """vLLM's new tokens for one request, through our output processor, as one RequestDelta."""
    completion = output.outputs[0]
    if output.num_cached_tokens is not None:
        state.seq.num_cached_prompt_tokens = int(output.num_cached_tokens)
    ids: list[int] = []
    text: list[str] = []
    logprobs: list[float] = []
    tops: list[Alternatives] = []
    finish: Finish | None = None
    for i, token in enumerate(completion.token_ids):
        entry = completion.logprobs[i] if completion.logprobs else None
        logprob = float(entry[token].logprob) if entry and token in entry else 0.0
        step = append_token(
            state, SampledToken(token, logprob, _alternatives(entry, state.params.top_logprobs))
        )
        ids.extend(step.new_token_ids)
        text.append(step.new_text)
        logprobs.extend(step.new_logprobs)
        tops.extend(step.new_top_logprobs)
        if step.finished and step.finish_reason is not None:
            finish = Finish(step.finish_reason, step.stop_reason)
            break
    if finish is None and output.finished:
        # Every stop rule vLLM applies is also ours, so this is an abort (or a rule we lack).
        reason = completion.finish_reason
        if reason == "stop":
            # vLLM reports our EOS as a stop token id (it runs with ignore_eos); we report none.
            matched = completion.stop_reason
            finish = Finish("stop", None if matched in state.eos_token_ids else matched)
        else:
            finish = Finish("length" if reason == "length" else "abort")
    delta = state.delta(ids, "".join(text), logprobs, finish, tops)
    # vLLM (0.32 on) reports a request's verify steps all at once, with the output that finishes it
    # (not when one of our stop strings ends it first: that request is aborted in vLLM).
    spec = getattr(completion, "spec_decode_metrics", None)
    if spec is not None:
        delta.drafts = list(zip(spec.per_step_drafted, spec.per_step_accepted, strict=True))
    return delta

"""vLLM's per-iteration stats turned into the node's `stats()` keys (the ones AsyncEngine reports).

vLLM hands every engine iteration's SchedulerStats and IterationStats to its stat loggers, on the
frontend's event loop; `StatsRecorder` is one such logger that keeps the latest scheduler state and
running totals, and feeds the drain meter with the tokens each iteration computed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from regional_node.engine.drain import DrainMeter
from regional_node.engine.speculative.policy import SpecDecodeStats


@dataclass
class EngineTotals:
    """What the node reports about vLLM's engine; replaced field by field on the event loop."""

    kv_cache_usage: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    # vLLM's speculative decoding (its per-iteration SpecDecodingStats, summed).
    spec: SpecDecodeStats = field(default_factory=SpecDecodeStats)

    def speculation(self) -> dict[str, Any]:
        """The spec_decode_* keys our engine's stats() has, so a node on either engine exports
        the same vllm:spec_decode_* series and /load acceptance rate."""
        return self.spec.counters()


def stat_logger_factory(totals: EngineTotals, drain: DrainMeter) -> Any:
    """A StatLoggerFactory for AsyncLLM(stat_loggers=[...]) that records into `totals` and `drain`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._last = time.monotonic()
            self._busy = False

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                totals.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
                totals.num_running = int(scheduler_stats.num_running_reqs)
                totals.num_waiting = int(scheduler_stats.num_waiting_reqs) + int(
                    scheduler_stats.num_skipped_waiting_reqs
                )
                cache = scheduler_stats.prefix_cache_stats
                totals.prefix_cache_query_tokens += int(cache.queries)
                totals.prefix_cache_hit_tokens += int(cache.hits)
                if scheduler_stats.spec_decoding_stats is not None:
                    _add_spec(totals.spec, scheduler_stats.spec_decoding_stats)
            if iteration_stats is not None:
                now = time.monotonic()
                prompt, generated = iteration_stats.num_prompt_tokens, iteration_stats.num_generation_tokens
                totals.prompt_tokens_total += prompt
                totals.generation_tokens_total += generated
                totals.num_preemptions += iteration_stats.num_preempted_reqs
                if prompt + generated:
                    # vLLM reports once per engine iteration: a busy engine's iteration ran since
                    # the previous report; after an idle spell, the idle time is not its.
                    drain.record(
                        self._last if self._busy else now,
                        now,
                        prompt + generated,
                        len(iteration_stats.finished_requests),
                    )
                self._last = now
                self._busy = totals.num_running + totals.num_waiting > 0

        def log_engine_initialized(self) -> None:
            pass

    return StatsRecorder


def _add_spec(totals: SpecDecodeStats, step: Any) -> None:
    """Add one vLLM iteration's SpecDecodingStats (its counts per draft position included)."""
    totals.num_drafts += int(step.num_drafts)
    totals.num_draft_tokens += int(step.num_draft_tokens)
    totals.num_accepted_tokens += int(step.num_accepted_tokens)
    per_pos = totals.num_accepted_tokens_per_pos
    per_pos.extend([0] * (len(step.num_accepted_tokens_per_pos) - len(per_pos)))
    for pos, count in enumerate(step.num_accepted_tokens_per_pos):
        per_pos[pos] += int(count)

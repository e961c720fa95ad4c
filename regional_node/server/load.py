"""The `/load` report the gateway's router reads: who this node is, and how busy its engines are.

Aggregates are over all of the node's engines: KV usage and the prefix-cache hit rate are
ratios of summed blocks/tokens (not averages of ratios), so a big pool weighs more than a small
one. The per-model breakdown lets the router pick the emptiest tier.

Overload (per model): the waiting prompt tokens per traffic tier, each tier's bound (from the
model's `queue` config, whether or not it is loaded yet), the engine's drain rate, and the
estimated time to first token of a new request per tier (regional_node/engine/admission.py, the
same estimate the node admits by). The report's `queue_wait_s` is the largest over the models.

Each model also carries the version it is configured as and its checkpoint's hash, its golden
probes' result (regional_node/probes), and the age of its oldest waiting request per tier.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from protocol.first_token import StepCost
from protocol.load import LoadReport, ModelEntry, ModelLoad
from regional_node.probes import ProbeState
from regional_node.server.checkpoint import checkpoint_hash
from regional_node.server.config import NodeConfig, ServedModelConfig
from regional_node.server.pool import ModelPool


def queue_ages(stats: Mapping[str, Any], now: float) -> dict[str, float]:
    """Seconds the oldest waiting request has waited, per tier, from the engine's arrival times."""
    return {
        str(tier): max(0.0, now - float(t)) for tier, t in (stats.get("oldest_waiting_by_tier") or {}).items()
    }


def load_report(config: NodeConfig, pool: ModelPool) -> LoadReport:
    served = {model.name: model for model in pool.models()}
    stats = pool.stats()
    probes = pool.probe_states()
    now = time.monotonic()
    per_model: dict[str, ModelLoad] = {}
    for model_config in pool.configs:
        model = served.get(model_config.name)
        per_model[model_config.name] = _model_load(
            model_config,
            stats.get(model_config.name, {}),
            model.max_model_len if model else None,
            probes.get(model_config.name),
            now,
        )
    ages: dict[str, float] = {}
    for load in per_model.values():
        for tier, age in load.queue_age_s_by_tier.items():
            ages[tier] = max(age, ages.get(tier, 0.0))
    loads = per_model.values()
    blocks_total = sum(load.kv_blocks_total for load in loads)
    blocks_used = sum(load.kv_blocks_used for load in loads)
    queries = sum(_int(s, "prefix_cache_query_tokens") for s in stats.values())
    hits = sum(_int(s, "prefix_cache_hit_tokens") for s in stats.values())
    return LoadReport(
        node_id=config.node_id,
        region=config.region,
        jurisdiction=config.jurisdiction,
        ready=pool.ready,
        models=[ModelEntry(name=m.name, tier=m.tier) for m in pool.configs],
        kv_cache_usage=blocks_used / blocks_total if blocks_total else 0.0,
        kv_blocks_total=blocks_total,
        kv_blocks_used=blocks_used,
        waiting_tokens=sum(load.waiting_tokens for load in loads),
        num_running=sum(load.num_running for load in loads),
        num_waiting=sum(load.num_waiting for load in loads),
        prefix_cache_hit_rate=hits / queries if queries else 0.0,
        queue_wait_s=max((load.queue_wait_s for load in loads), default=0.0),
        per_model=per_model,
        queue_age_s_by_tier=ages,
    )


def _model_load(
    config: ServedModelConfig,
    stats: Mapping[str, Any],
    max_model_len: int | None,
    probe: ProbeState | None,
    now: float,
) -> ModelLoad:
    probe = probe or ProbeState()
    return ModelLoad(
        tier=config.tier,
        loaded=bool(stats),
        version=config.version or "",
        checkpoint=checkpoint_hash(config.path),
        max_model_len=max_model_len,
        kv_cache_usage=float(stats.get("kv_cache_usage", 0.0) or 0.0),
        kv_blocks_total=_int(stats, "kv_blocks_total"),
        kv_blocks_used=_int(stats, "kv_blocks_used"),
        waiting_tokens=_int(stats, "waiting_tokens"),
        num_running=_int(stats, "num_running"),
        num_waiting=_int(stats, "num_waiting"),
        num_preemptions=_int(stats, "num_preemptions"),
        prefix_cache_hit_rate=float(stats.get("prefix_cache_hit_rate", 0.0) or 0.0),
        waiting_tokens_by_tier={
            str(tier): int(tokens) for tier, tokens in (stats.get("waiting_tokens_by_tier") or {}).items()
        },
        queue_bound_tokens=config.queue_bounds(),
        drain_tokens_per_s=float(stats.get("drain_tokens_per_s", 0.0) or 0.0),
        waiting_requests_by_tier={
            str(tier): int(n) for tier, n in (stats.get("waiting_requests_by_tier") or {}).items()
        },
        max_num_seqs=stats.get("max_num_seqs"),
        max_num_batched_tokens=_int(stats, "max_num_batched_tokens"),
        long_prefill_token_threshold=_int(stats, "long_prefill_token_threshold"),
        step_cost=stats.get("step_cost") or StepCost(),
        finish_rate=float(stats.get("finish_rate", 0.0) or 0.0),
        spec_decode_acceptance_rate=stats.get("spec_decode_acceptance_rate"),
        first_token_s_by_tier={
            str(tier): float(wait) for tier, wait in (stats.get("first_token_s_by_tier") or {}).items()
        },
        queue_wait_s=float(stats.get("queue_wait_s", 0.0) or 0.0),
        queue_age_s_by_tier=queue_ages(stats, now),
        probe=probe.status,
        probe_failures=probe.failures,
        probe_last_success=probe.last_success,
    )


def _int(stats: Mapping[str, Any], key: str) -> int:
    return int(stats.get(key, 0) or 0)

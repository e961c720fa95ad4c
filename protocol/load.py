"""The `/load` report a regional node serves and the gateway's prober reads.

Every field has a default, so a reader accepts a report from a node older or newer than itself
(a missing field reads as idle, an unknown one is ignored) instead of losing the node's load.
"""

from __future__ import annotations

import msgspec

from protocol.first_token import StepCost
from protocol.prefix_cache import PrefixCacheState


class ModelEntry(msgspec.Struct, kw_only=True):
    name: str
    tier: str


class ModelLoad(msgspec.Struct, kw_only=True):
    tier: str = ""
    loaded: bool = False
    # The version the node serves this model as ("": unversioned) and a short hash of the
    # checkpoint it loaded (regional_node/server/checkpoint.py), for rollouts and drift checks.
    version: str = ""
    checkpoint: str = ""
    max_model_len: int | None = None
    kv_cache_usage: float = 0.0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    waiting_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    prefix_cache_hit_rate: float = 0.0
    # Overload (issue 14): the queue per traffic tier ("interactive", "batch"), its bound, and how
    # fast the engine works through queued tokens, so a reader can estimate a new request's wait.
    waiting_tokens_by_tier: dict[str, int] = msgspec.field(default_factory=dict)
    queue_bound_tokens: dict[str, int] = msgspec.field(default_factory=dict)  # per tier; absent: unbounded
    drain_tokens_per_s: float = 0.0  # prompt + generated tokens processed per second, recent window
    # The inputs of the time-to-first-token estimate (protocol/first_token.py), so the gateway can
    # run it again with the requests it admitted since this report: requests waiting per tier,
    # the engine's batch limits, its fitted step cost, and how fast it frees sequence slots.
    waiting_requests_by_tier: dict[str, int] = msgspec.field(default_factory=dict)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int = 0
    long_prefill_token_threshold: int = 0  # partial prefills (protocol/first_token.py); 0: none
    step_cost: StepCost = msgspec.field(default_factory=StepCost)
    finish_rate: float = 0.0
    # Estimated seconds to a new request's first token, per tier (the node's own admission
    # estimate: a free slot, then its prefill steps at the fitted step cost), and the largest.
    first_token_s_by_tier: dict[str, float] = msgspec.field(default_factory=dict)
    queue_wait_s: float = 0.0
    # Seconds the oldest request waiting for its first step has waited, per tier (issue 34);
    # absent tier: none waiting.
    queue_age_s_by_tier: dict[str, float] = msgspec.field(default_factory=dict)
    # Golden-output probes (regional_node/probes): "none" (not probed), "pending", "passed" or
    # "failed"; a failing model is not served by this node. Failed rounds since the node started,
    # and the Unix time of the last round that passed (None: none yet).
    probe: str = "none"
    probe_failures: int = 0
    probe_last_success: float | None = None
    # Speculative decoding (issue 33): accepted / proposed tokens since start; None when the
    # model does not speculate.
    spec_decode_acceptance_rate: float | None = None


class LoadReport(msgspec.Struct, kw_only=True):
    """Aggregates over all of the node's engines, plus a per-model breakdown."""

    node_id: str = ""
    region: str = ""
    jurisdiction: str = ""
    ready: bool = False
    models: list[ModelEntry] = msgspec.field(default_factory=list)
    kv_cache_usage: float = 0.0  # 0..1: used / total KV blocks, summed over engines
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    waiting_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    prefix_cache_hit_rate: float = 0.0
    # The largest estimated queue wait over the node's models (per model in `per_model`).
    queue_wait_s: float = 0.0
    per_model: dict[str, ModelLoad] = msgspec.field(default_factory=dict)
    # The oldest waiting request's age per tier over the node's models (per model in `per_model`).
    queue_age_s_by_tier: dict[str, float] = msgspec.field(default_factory=dict)
    # The message prefixes whose KV blocks the node holds, whole or as changes since the version
    # the reader asked with (`/load?prefixes=<epoch>.<version>`); None: a node that publishes none.
    prefix_cache: PrefixCacheState | None = None

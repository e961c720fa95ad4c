"""The routing knobs, in one frozen object built once and handed to `route`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoutingParams:
    # A node is saturated (sinks below every unsaturated node) at either threshold: past ~95% KV
    # use the engine starts preempting, and a long queue means seconds before a first token.
    saturated_kv_usage: float = 0.95
    saturated_waiting_tokens: int = 32_768
    # Queued tokens that weigh as much as a full KV cache in the load score.
    waiting_tokens_per_cache: int = 16_384
    # Score of a node that has not reported its load: in the middle, neither preferred nor shunned.
    unknown_load: float = 0.5
    # Loads in the same band count as "similar"; prefix affinity decides between them. Wider bands
    # favour cache hits, narrower bands favour balance.
    load_band_width: float = 0.2
    # Estimated first-token costs (router/cost.py) in one band are equal; cached tokens, load
    # band, then prefix affinity decide between them. Bands: below cost_quantum_s (about one
    # small engine step), then each cost_ratio times the last.
    cost_quantum_s: float = 0.02
    cost_ratio: float = 1.25
    # A node holding at least half the prompt stays equal to the cheapest up to this ratio
    # (router/ordering.py): the hysteresis before a prompt is prefilled on a second node.
    holder_ratio: float = 2.0
    # Among equal costs, a prompt mostly uncached goes where fewer requests are queued (a cold
    # prefill holds up every request sharing its engine steps); False: straight to load band.
    queue_ahead_tiebreak: bool = True
    # Prefill seconds per prompt token for a node that has not measured its step cost, when no
    # node of the model has either (a guess: ~5,000 tokens/s).
    prefill_s_per_token: float = 0.0002

    def __post_init__(self) -> None:
        assert 0.0 < self.saturated_kv_usage <= 1.0, "saturated_kv_usage must be in (0, 1]"
        assert self.saturated_waiting_tokens > 0, "saturated_waiting_tokens must be positive"
        assert self.waiting_tokens_per_cache > 0, "waiting_tokens_per_cache must be positive"
        assert self.load_band_width > 0.0, "load_band_width must be positive"
        assert self.cost_quantum_s > 0.0, "cost_quantum_s must be positive"
        assert self.cost_ratio > 1.0, "cost_ratio must be above 1"
        assert self.holder_ratio >= 1.0, "holder_ratio must be at least 1"
        assert self.prefill_s_per_token > 0.0, "prefill_s_per_token must be positive"


DEFAULT_PARAMS = RoutingParams()

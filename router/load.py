"""How routing reads a node's load report: one score, one saturation flag, one band."""

from __future__ import annotations

import math

from router.params import RoutingParams
from router.types import NodeLoad


def _known(load: NodeLoad | None) -> bool:
    # A report with NaN in it is as good as no report: treat the node as unknown, i.e. neutral.
    return load is not None and not math.isnan(load.kv_cache_usage)


def load_score(load: NodeLoad | None, params: RoutingParams) -> float:
    """KV-cache use (0..1) plus queued tokens in units of a full cache; unknown → neutral."""
    if not _known(load):
        return params.unknown_load
    assert load is not None
    kv = min(max(load.kv_cache_usage, 0.0), 1.0)
    return kv + max(load.waiting_tokens, 0) / params.waiting_tokens_per_cache


def is_saturated(load: NodeLoad | None, params: RoutingParams) -> bool:
    """Known to be full: KV use or queue at its threshold. A node that has not reported is not."""
    if not _known(load):
        return False
    assert load is not None
    return (
        load.kv_cache_usage >= params.saturated_kv_usage
        or load.waiting_tokens >= params.saturated_waiting_tokens
    )


def load_band(load: NodeLoad | None, params: RoutingParams) -> int:
    """Which band of width `load_band_width` the score falls in; equal bands are "similar load"."""
    return math.floor(load_score(load, params) / params.load_band_width)


def describe_load(load: NodeLoad | None, params: RoutingParams) -> str:
    if not _known(load):
        return "load=unknown"
    text = f"load={load_score(load, params):.2f}"
    return text + ";saturated" if is_saturated(load, params) else text


def load_facts(load: NodeLoad | None, params: RoutingParams) -> tuple[bool, int, str]:
    """(saturated, band, description): ordering needs all three for every node on every request,
    so they are derived once per report."""
    if not _known(load):
        return False, math.floor(params.unknown_load / params.load_band_width), "load=unknown"
    assert load is not None
    # Keyed by the params object itself: hashing the params (every field) cost more than the facts.
    memo = load.derived.get("facts")
    if memo is not None and memo[0] is params:
        return memo[1]
    saturated = is_saturated(load, params)
    score = load_score(load, params)
    text = f"load={score:.2f}"
    band = math.floor(score / params.load_band_width)
    facts = (saturated, band, text + ";saturated" if saturated else text)
    load.derived["facts"] = (params, facts)
    return facts

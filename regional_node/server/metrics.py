"""Prometheus metrics for one node app, in its own CollectorRegistry (never the global one).

Latencies and token counts are recorded per request by the serving code; engine state (running,
waiting, KV use, prefix-cache and preemption totals) is read from `engine.stats()` at scrape
time by a custom collector, so it is never stale and costs nothing between scrapes. The same
registry carries vLLM's metric contract (vllm_metrics.py), fed from the same sources.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from regional_node.probes import ProbeState
from regional_node.server.load import queue_ages
from regional_node.server.vllm_metrics import ENGINE, VllmRequestMetrics, VllmStatsCollector
from regional_node.utilization import UtilizationReport

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds; CPU test models answer in milliseconds, GPU nodes serving long prompts in seconds.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

# Tenants come from a header or the OpenAI `user` field (often one id per end user), so their
# number is unbounded; past this many, new tenants share one series instead of adding their own.
MAX_TENANT_SERIES = 100
# The traffic tiers whose queue age is always exported (0 when empty), so alerts find a series.
TIERS = ("interactive", "batch")
OTHER_TENANT = "other"

# (metric suffix, stats() key, help): gauges read from engine.stats() at scrape time.
_GAUGES = (
    ("num_requests_running", "num_running", "Requests in the engine's running batch."),
    ("num_requests_waiting", "num_waiting", "Requests queued for admission."),
    ("waiting_tokens", "waiting_tokens", "Prompt tokens queued for admission."),
    ("kv_cache_usage_ratio", "kv_cache_usage", "Fraction of KV-cache blocks in use (0..1)."),
    ("kv_blocks_total", "kv_blocks_total", "KV-cache blocks in the pool."),
    ("kv_blocks_used", "kv_blocks_used", "KV-cache blocks held by requests."),
    ("kv_blocks_cached", "kv_blocks_cached", "Free KV-cache blocks still holding a reusable prefix."),
    ("prefix_cache_hit_rate", "prefix_cache_hit_rate", "Prefix-cache hit tokens / query tokens."),
    (
        "drain_tokens_per_second",
        "drain_tokens_per_s",
        "Prompt and generated tokens the engine computed per second, over the last few seconds.",
    ),
    (
        "estimated_queue_wait_seconds",
        "queue_wait_s",
        "Estimated wait before a new lowest-tier request's first step: waiting tokens / drain rate.",
    ),
)
# (metric suffix, stats() key of a {tier: value} mapping, help): gauges labelled model and tier.
_TIER_GAUGES = (
    ("queue_waiting_tokens", "waiting_tokens_by_tier", "Prompt tokens queued for admission, per tier."),
    (
        "queue_bound_tokens",
        "queue_bound_tokens",
        "The bound on a tier's queued prompt tokens (absent: none).",
    ),
)
_COUNTERS = (
    (
        "prefix_cache_query_tokens",
        "prefix_cache_query_tokens",
        "Prompt tokens looked up in the prefix cache.",
    ),
    ("prefix_cache_hit_tokens", "prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache."),
    ("num_preemptions", "num_preemptions", "Running requests preempted to free KV-cache blocks."),
)


@dataclass
class RequestTimings:
    """One finished request's latency split, in seconds (None where it did not happen)."""

    ttft: float | None
    e2e: float
    decode: float | None
    inter_token: list[float]
    queue_wait: float | None = None
    prefill: float | None = None


class EngineStatsCollector(Collector):
    """Turns each engine's `stats()` into gauges and counters labelled by model."""

    def __init__(self, prefix: str, stats: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self._prefix = prefix
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        per_model = self._stats()
        for suffix, key, help_text in _GAUGES:
            gauge = GaugeMetricFamily(f"{self._prefix}{suffix}", help_text, labels=["model"])
            for model, stats in per_model.items():
                gauge.add_metric([model], float(stats.get(key, 0) or 0))
            yield gauge
        for suffix, key, help_text in _TIER_GAUGES:
            gauge = GaugeMetricFamily(f"{self._prefix}{suffix}", help_text, labels=["model", "tier"])
            for model, stats in per_model.items():
                for tier, value in (stats.get(key) or {}).items():
                    gauge.add_metric([model, tier], float(value))
            yield gauge
        for suffix, key, help_text in _COUNTERS:
            counter = CounterMetricFamily(f"{self._prefix}{suffix}", help_text, labels=["model"])
            for model, stats in per_model.items():
                counter.add_metric([model], float(stats.get(key, 0) or 0))
            yield counter


class OperationsCollector(Collector):
    """Queue age per tier, golden-probe results and utilization per phase, read at scrape time
    (regional_node/probes, regional_node/utilization)."""

    def __init__(
        self,
        prefix: str,
        stats: Callable[[], Mapping[str, Mapping[str, Any]]],
        probes: Callable[[], Mapping[str, ProbeState]],
        utilization: Callable[[], Mapping[str, UtilizationReport]],
    ) -> None:
        self._prefix = prefix
        self._stats = stats
        self._probes = probes
        self._utilization = utilization

    def collect(self) -> Iterable[Metric]:
        p = self._prefix
        now = time.monotonic()
        age = GaugeMetricFamily(
            f"{p}queue_age_seconds",
            "Age of the oldest request waiting for its first step, per tier (0: none waiting).",
            labels=["model", "tier"],
        )
        for model, stats in self._stats().items():
            ages = queue_ages(stats, now)
            for tier in TIERS:
                age.add_metric([model, tier], ages.get(tier, 0.0))
        yield age
        yield from self._probe_metrics()
        yield from self._utilization_metrics()

    def _probe_metrics(self) -> Iterable[Metric]:
        p = self._prefix
        failures = CounterMetricFamily(
            f"{p}probe_failures", "Golden-output probe rounds that failed, per model.", labels=["model"]
        )
        last = GaugeMetricFamily(
            f"{p}probe_last_success_timestamp_seconds",
            "Unix time of the model's last golden-output probe round that passed (absent: none yet).",
            labels=["model"],
        )
        passing = GaugeMetricFamily(
            f"{p}probe_passing",
            "1 while the model passes its golden-output probes (or has none), 0 while it fails or is "
            "not probed yet; a failing model is not served by this node.",
            labels=["model"],
        )
        for model, state in self._probes().items():
            failures.add_metric([model], float(state.failures))
            passing.add_metric([model], 1.0 if state.status in ("passed", "none") else 0.0)
            if state.last_success is not None:
                last.add_metric([model], state.last_success)
        yield from (failures, last, passing)

    def _utilization_metrics(self) -> Iterable[Metric]:
        p = self._prefix
        labels = ["model", "phase"]
        mfu = GaugeMetricFamily(
            f"{p}model_flops_utilization",
            "Model FLOPs / (peak FLOP/s x step time) over the phase's steps of the last minute.",
            labels=labels,
        )
        mbu = GaugeMetricFamily(
            f"{p}memory_bandwidth_utilization",
            "Bytes moved (weights, KV read and written) / (peak bytes/s x step time), last minute.",
            labels=labels,
        )
        seconds = CounterMetricFamily(f"{p}phase_seconds", "Engine step time per phase.", labels=labels)
        tokens = CounterMetricFamily(f"{p}phase_tokens", "Tokens computed per phase.", labels=labels)
        flops = CounterMetricFamily(f"{p}phase_flops", "Model FLOPs computed per phase.", labels=labels)
        moved = CounterMetricFamily(f"{p}phase_bytes", "Bytes moved per phase.", labels=labels)
        peak_flops = GaugeMetricFamily(
            f"{p}peak_flops_per_second",
            "The device's peak FLOP/s in the model's dtype (source: datasheet table or measured).",
            labels=["model", "source"],
        )
        peak_bytes = GaugeMetricFamily(
            f"{p}peak_memory_bandwidth_bytes_per_second",
            "The device's peak memory bandwidth (source: datasheet table or measured).",
            labels=["model", "source"],
        )
        for model, report in self._utilization().items():
            peak_flops.add_metric([model, report.peak.source], report.peak.flops_per_s)
            peak_bytes.add_metric([model, report.peak.source], report.peak.bytes_per_s)
            for phase, value in report.utilization.items():
                mfu.add_metric([model, phase], value.mfu)
                mbu.add_metric([model, phase], value.mbu)
            for phase, total in report.totals.items():
                seconds.add_metric([model, phase], total.seconds)
                tokens.add_metric([model, phase], float(total.tokens))
                flops.add_metric([model, phase], total.flops)
                moved.add_metric([model, phase], total.bytes)
        yield from (mfu, mbu, seconds, tokens, flops, moved, peak_flops, peak_bytes)


class NodeMetrics:
    """Every `meridian_node_*` series of one app."""

    PREFIX = "meridian_node_"

    def __init__(
        self,
        engine_stats: Callable[[], Mapping[str, Mapping[str, Any]]],
        cache_configs: Callable[[], Mapping[str, Mapping[str, str]]] = dict,
        *,
        probes: Callable[[], Mapping[str, ProbeState]] = dict,
        utilization: Callable[[], Mapping[str, UtilizationReport]] = dict,
        models: Iterable[str] = (),
    ) -> None:
        """`cache_configs`: each model's KV-cache settings, for `vllm:cache_config_info`;
        `models`: the configured names, whose latency histograms exist (empty) from the start."""
        self.registry = CollectorRegistry(auto_describe=True)
        p, r = self.PREFIX, self.registry

        def histogram(name: str, help_text: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
            return Histogram(f"{p}{name}", help_text, ["model"], registry=r, buckets=buckets)

        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first generated token.")
        self.inter_token = histogram(
            "inter_token_latency_seconds", "Gap between consecutive generated tokens.", _TOKEN_GAP_BUCKETS
        )
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to last token.")
        self.queue_wait = histogram("queue_wait_seconds", "Arrival to first scheduling in the engine.")
        self.prefill = histogram("prefill_seconds", "First scheduling to first generated token.")
        self.decode = histogram("decode_seconds", "First generated token to last.")
        self.prompt_tokens = Counter(
            f"{p}prompt_tokens", "Prompt tokens of finished requests.", ["model", "tenant"], registry=r
        )
        self.generation_tokens = Counter(
            f"{p}generation_tokens",
            "Tokens generated for finished requests.",
            ["model", "tenant"],
            registry=r,
        )
        self.requests = Counter(
            f"{p}requests",
            "Requests by outcome: the finish reason, or error / disconnected / overloaded.",
            ["model", "endpoint", "outcome"],
            registry=r,
        )
        self.refused = Counter(
            f"{p}requests_refused",
            "Requests refused before entering the engine, by tier and reason (queue_tokens: the "
            "tier's queue bound; queue_wait: its wait limit).",
            ["model", "tier", "reason"],
            registry=r,
        )
        r.register(EngineStatsCollector(p, engine_stats))
        r.register(OperationsCollector(p, engine_stats, probes, utilization))
        r.register(VllmStatsCollector(engine_stats, cache_configs))
        self.vllm = VllmRequestMetrics(r)
        self._tenants: set[str] = set()
        for model in models:
            self._precreate(model)

    def _precreate(self, model: str) -> None:
        # vLLM creates its histograms per model when the engine starts, so a dashboard or
        # autoscaler reading them finds zeros rather than nothing before the first request.
        for ours in (self.ttft, self.inter_token, self.e2e, self.queue_wait, self.prefill, self.decode):
            ours.labels(model)
        vllm = self.vllm
        for theirs in (vllm.ttft, vllm.inter_token, vllm.e2e, vllm.queue, vllm.prefill, vllm.decode):
            theirs.labels(model, ENGINE)

    def observe_timings(self, model: str, timings: RequestTimings) -> None:
        vllm = self.vllm
        pairs = (
            (timings.e2e, self.e2e, vllm.e2e),
            (timings.ttft, self.ttft, vllm.ttft),
            (timings.decode, self.decode, vllm.decode),
            (timings.queue_wait, self.queue_wait, vllm.queue),
            (timings.prefill, self.prefill, vllm.prefill),
        )
        for value, ours, theirs in pairs:
            if value is not None:
                ours.labels(model).observe(value)
                theirs.labels(model, ENGINE).observe(value)
        gaps, vllm_gaps = self.inter_token.labels(model), vllm.inter_token.labels(model, ENGINE)
        for gap in timings.inter_token:
            gaps.observe(gap)
            vllm_gaps.observe(gap)

    def observe_tokens(self, model: str, tenant: str, prompt_tokens: int, generation_tokens: int) -> None:
        if tenant not in self._tenants:
            if len(self._tenants) >= MAX_TENANT_SERIES:
                tenant = OTHER_TENANT
            else:
                self._tenants.add(tenant)
        self.prompt_tokens.labels(model, tenant).inc(prompt_tokens)
        self.generation_tokens.labels(model, tenant).inc(generation_tokens)

    def count_request(self, model: str, endpoint: str, outcome: str) -> None:
        self.requests.labels(model, endpoint, outcome).inc()

    def count_refused(self, model: str, tier: str, reason: str) -> None:
        self.refused.labels(model, tier, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""The model-server metric contract: vLLM's metric names, types, labels and buckets on every node.

Kubernetes-native routers and autoscalers (the Gateway API Inference Extension's endpoint picker,
llm-d, KEDA recipes) read these names from model servers; exporting them lets such a component,
written for vLLM, drive a Meridian node unchanged. They sit beside the `meridian_node_*` series
in the node's one registry and come from the same sources: engine state read from
`engine.stats()` at scrape time, request latencies from the same per-request timings.

Labels follow vLLM's V1 engine: `model_name` (the served model's name) and `engine` (the engine
index; a node runs one engine per model, so always "0"). The histogram buckets are vLLM's own, so
quantiles computed over a mixed vLLM/Meridian pool stay comparable. The mapping to our own series
is in regional_node/server/README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LABELS = ("model_name", "engine")
ENGINE = "0"

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# (name, stats() key, help): read from engine.stats() at scrape time.
_GAUGES = (
    ("vllm:num_requests_running", "num_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "num_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "kv_cache_usage", "KV-cache usage. 1 means 100 percent usage."),
)
_COUNTERS = (
    (
        "vllm:prefix_cache_queries",
        "prefix_cache_query_tokens",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    (
        "vllm:prefix_cache_hits",
        "prefix_cache_hit_tokens",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    ("vllm:num_preemptions", "num_preemptions", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens", "prompt_tokens_total", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "generation_tokens_total", "Number of generation tokens processed."),
)

_SPEC_DECODE_COUNTERS = (
    ("vllm:spec_decode_num_drafts", "spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("vllm:spec_decode_num_draft_tokens", "spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("vllm:spec_decode_num_accepted_tokens", "spec_decode_num_accepted_tokens", "Number of accepted tokens."),
)


class VllmStatsCollector(Collector):
    """Engine state under vLLM's names: gauges, counters and the cache-config info gauge."""

    def __init__(
        self,
        stats: Callable[[], Mapping[str, Mapping[str, Any]]],
        cache_configs: Callable[[], Mapping[str, Mapping[str, str]]],
    ) -> None:
        self._stats = stats
        self._cache_configs = cache_configs

    def collect(self) -> Iterable[Metric]:
        per_model = self._stats()
        for name, key, help_text in _GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=LABELS)
            for model, stats in per_model.items():
                gauge.add_metric([model, ENGINE], float(stats.get(key, 0) or 0))
            yield gauge
        for name, key, help_text in _COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=LABELS)
            for model, stats in per_model.items():
                counter.add_metric([model, ENGINE], float(stats.get(key, 0) or 0))
            yield counter
        yield from self._spec_decode(per_model)
        yield from self._cache_config_info()

    def _spec_decode(self, per_model: Mapping[str, Mapping[str, Any]]) -> Iterable[Metric]:
        """vLLM's speculative-decoding counters, for the models that speculate."""
        speculating = {m: s for m, s in per_model.items() if "spec_decode_num_drafts" in s}
        if not speculating:
            return
        for name, key, help_text in _SPEC_DECODE_COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=LABELS)
            for model, stats in speculating.items():
                counter.add_metric([model, ENGINE], float(stats[key]))
            yield counter
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=[*LABELS, "position"],
        )
        for model, stats in speculating.items():
            for pos, count in enumerate(stats["spec_decode_num_accepted_tokens_per_pos"]):
                per_pos.add_metric([model, ENGINE, str(pos)], float(count))
        yield per_pos

    def _cache_config_info(self) -> Iterable[Metric]:
        # An info metric as vLLM writes it: a gauge fixed at 1 whose labels are the config.
        configs = self._cache_configs()
        keys = sorted({key for config in configs.values() for key in config})
        gauge = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=[*keys, "engine"]
        )
        for config in configs.values():
            gauge.add_metric([*(config.get(key, "") for key in keys), ENGINE], 1.0)
        yield gauge


class VllmRequestMetrics:
    """The per-request histograms, observed with the same timings as `meridian_node_*`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_text, LABELS, registry=registry, buckets=buckets)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )

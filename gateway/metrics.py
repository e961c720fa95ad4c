"""The gateway's Prometheus metrics, in a registry owned by one app (tests build many apps)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.observe import QuietCall
from router.types import NodeLoad

# The traffic tiers whose queue age is always set (0 when none waits), so alerts find a series.
QUEUE_TIERS = ("interactive", "batch")

# Gateway-added latency is milliseconds; whole requests on CPU nodes run to tens of seconds.
# Signed: an estimate's error either way, finest near zero.
_ERROR_BUCKETS = (
    -2.5,
    -1.0,
    -0.5,
    -0.25,
    -0.1,
    -0.05,
    -0.025,
    -0.01,
    0.0,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# The gateway's own share of a request: a fraction of a millisecond when all is well.
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "meridian_gateway_requests",
            "Client requests by tenant, served model, region and outcome (HTTP status or stream_error).",
            ["tenant", "model", "region", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "meridian_gateway_request_duration_seconds",
            "Time from receiving a request to its last byte.",
            ["model", "stream"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "meridian_gateway_overhead_seconds",
            "The gateway's own share of a request: its total time minus the time it waited on "
            "upstreams (every attempt, and every upstream chunk of a stream).",
            ["model", "stream"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "meridian_gateway_time_to_first_token_seconds",
            "Time from receiving a streaming request to its first upstream chunk.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_attempts = Counter(
            "meridian_gateway_upstream_attempts",
            "Attempts on upstream targets by outcome (ok, retryable, rejected, broken).",
            ["target", "region", "outcome"],
            registry=r,
        )
        self.quota_admissions = Counter(
            "meridian_gateway_quota_admissions",
            "Requests admitted by quota, by the store that admitted them: redis, memory, or local "
            "(Redis unreachable: this replica's fail-open share of the tenant's limits).",
            ["tenant", "store"],
            registry=self.registry,
        )
        self.failovers = Counter(
            "meridian_gateway_failovers",
            "Retries on another target before the first byte (retry) and streams continued "
            "elsewhere after a break (continuation).",
            ["kind"],
            registry=r,
        )
        self.tokens = Counter(
            "meridian_gateway_tokens",
            "Tokens served, by tenant and kind (prompt, completion), from the nodes' usage.",
            ["tenant", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "meridian_gateway_cost_usd",
            "What served requests cost in USD, by tenant and served model, from the catalog's prices "
            "(the same amount the usage ledger records).",
            ["tenant", "model"],
            registry=r,
        )
        # Overload (gateway/admission). Shed and degraded are two counters, not one with an outcome
        # label: a shed request was refused and a degraded one was served, so alerts and
        # dashboards read them apart; and only a shed has a reason.
        self.shed = Counter(
            "meridian_gateway_shed",
            "Requests refused by admission (429 overloaded) before any upstream call, by reason: "
            "queue_full (the tier's gateway queue was full), deadline (waited queue_deadline_s), "
            "over_target (the tier does not queue).",
            ["tenant", "tier", "reason"],
            registry=r,
        )
        self.degraded = Counter(
            "meridian_gateway_degraded",
            "Requests served by the small tier because their model's pool was over the tier's target.",
            ["tenant", "tier"],
            registry=r,
        )
        self.queue_length = Gauge(
            "meridian_gateway_queue_length",
            "Requests waiting in the gateway's admission queue, per traffic tier.",
            ["tier"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "meridian_gateway_queue_wait_seconds",
            "Time requests spent in the gateway's admission queue, per traffic tier and outcome "
            "(admitted, shed).",
            ["tier", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pool_wait = Gauge(
            "meridian_gateway_pool_queue_wait_seconds",
            "Estimated time to a new one-token request's first token, per model pool and traffic "
            "tier, over the whole fleet (router/overload.py); computed when scraped.",
            ["model", "tier"],
            registry=r,
        )
        # How good admission's estimate is: for each admitted request that got a first token, the
        # TTFT that followed (from admission to the first chunk) minus the estimate admission
        # decided on. Positive: the pool was slower than estimated (admission let too much in).
        # Signed buckets, so Prometheus keeps no _sum: read it with histogram_quantile.
        self.admission_estimate_error = Histogram(
            "meridian_gateway_admission_estimate_error_seconds",
            "Observed time to first token minus admission's estimate, per model pool and traffic tier.",
            ["model", "tier"],
            buckets=_ERROR_BUCKETS,
            registry=r,
        )
        # Tiered escalation for `model: "auto"` (router/classifier.py, router/confidence.py,
        # gateway/escalation). Decisions are counted where the plan is made; the cascade counts
        # escalations, the small tier's wasted tokens and the rate.
        self.auto_decisions = Counter(
            "meridian_gateway_auto_decisions",
            "`auto` requests by the tier they started on and what decided it (classifier, length, "
            "thrash_cooldown).",
            ["tenant", "start_tier", "reason"],
            registry=r,
        )
        self.auto_escalations = Counter(
            "meridian_gateway_auto_escalations",
            "`auto` requests the confidence cascade judged too doubtful for the small tier, by reason: "
            "low_confidence (the large tier served them), large_unavailable (it could not: the small "
            "answer stood).",
            ["tenant", "family", "reason"],
            registry=r,
        )
        self.auto_wasted_tokens = Counter(
            "meridian_gateway_auto_wasted_tokens",
            "Tokens spent on the small tier for requests that then escalated (prompt and the judged "
            "completion tokens), by kind.",
            ["tenant", "family", "kind"],
            registry=r,
        )
        self.auto_escalation_rate = Gauge(
            "meridian_gateway_auto_escalation_rate",
            "The escalation rate the classifier weighs for a tenant's `auto` requests: the time-decayed "
            "share of its judged requests that escalated (auto.escalation_rate); 0 below min_judged.",
            ["tenant", "family"],
            registry=r,
        )
        # Batches (gateway/batches): their lines also count as requests (tier batch) above.
        self.batch_lines = Counter(
            "meridian_gateway_batch_lines",
            "Batch lines this gateway ran, by outcome: completed, failed (answered with an error, in "
            "the error file), retried (given back: capacity was short), dropped (its lease lapsed "
            "while it ran, so another gateway's answer stands).",
            ["tenant", "outcome"],
            registry=r,
        )
        self.batch_lines_running = Gauge(
            "meridian_gateway_batch_lines_running",
            "Batch lines this gateway is running now (at most batches.concurrency).",
            registry=r,
        )
        self.batches_ended = Counter(
            "meridian_gateway_batches_ended",
            "Batches this gateway ended, by final status (completed, expired, cancelled).",
            ["tenant", "status"],
            registry=r,
        )
        self.batch_duration = Histogram(
            "meridian_gateway_batch_duration_seconds",
            "Time from a batch's creation to its end, by final status.",
            ["status"],
            buckets=(10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 48 * 3600),
            registry=r,
        )
        self.node_ready = Gauge(
            "meridian_gateway_node_ready",
            "1 while the node is routed to: its last answered /ready probe said 200, and fewer than "
            "timeouts.probe_misses in a row went unanswered since.",
            ["node_id", "region"],
            registry=r,
        )
        self.node_probe_missed = Counter(
            "meridian_gateway_node_probe_missed_total",
            "/ready probes the node left unanswered within timeouts.probe_s (a busy or hung node).",
            ["node_id", "region"],
            registry=r,
        )
        self.node_queue_age = Gauge(
            "meridian_gateway_node_queue_age_seconds",
            "Age of the oldest request waiting on the node, per model and tier, as of its last /load.",
            ["node_id", "region", "model", "tier"],
            registry=r,
        )
        self.node_probe_failed = Gauge(
            "meridian_gateway_node_probe_failed",
            "1 while the node's last /load says the model fails its golden probes (not routed there).",
            ["node_id", "region", "model"],
            registry=r,
        )

    def node_probed(
        self, node_id: str, region: str, *, ready: bool, load: NodeLoad | None, missed: bool = False
    ) -> None:
        """A node's probe (gateway/health/probes.py): whether it is ready, whether its /ready went
        unanswered, and what its /load said."""
        self.node_ready.labels(node_id, region).set(1.0 if ready else 0.0)
        if missed:
            self.node_probe_missed.labels(node_id, region).inc()
        if load is None:
            return
        # The queue age per tier and the probe state of each of the node's models.
        for model, queue in load.models.items():
            for tier in QUEUE_TIERS:
                age = queue.queue_age_s_by_tier.get(tier, 0.0)
                self.node_queue_age.labels(node_id, region, model, tier).set(age)
            self.node_probe_failed.labels(node_id, region, model).set(
                1.0 if model in load.probe_failed else 0.0
            )

    def labelled(self, metric: Counter | Histogram, *values: str) -> Any:
        """`metric.labels(*values)`, remembered: labels() validates and locks on every call, and
        the request path asks for the same few children on every request. Bounded like the
        metric's own children (tenants x models x regions x outcomes)."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- the request path's observer (gateway/observe.py) ---------------------------------------

    def start(self, headers: Mapping[str, str], request_id: str) -> _CallMetrics:
        return _CallMetrics(self)


class _CallMetrics(QuietCall):
    """One call's metrics: requests, latency, the gateway's overhead, time to first chunk and
    tokens, counted when the call is over. Stages are not metered (their spans time them)."""

    # A token count is a request but no generation: kept out of the latency histograms, where its
    # few milliseconds would read as a faster model.
    _counting = False

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def planned(self, operation: str, request: Any, prompt: Any, degraded: bool) -> None:
        self._counting = operation == "count_tokens"

    def first_chunk(self, model: str, seconds: float) -> None:
        self._metrics.labelled(self._metrics.ttft, model).observe(seconds)

    def auto_routed(self, tenant: str, tier: str, rule: str) -> None:
        self._metrics.labelled(self._metrics.auto_decisions, tenant, tier, rule).inc()

    def escalation_judged(self, tenant: str, family: str, rate: float) -> None:
        self._metrics.labelled(self._metrics.auto_escalation_rate, tenant, family).set(rate)

    def escalated(
        self, tenant: str, family: str, outcome: str, wasted: tuple[int, int] | None = None
    ) -> None:
        metrics = self._metrics
        metrics.labelled(metrics.auto_escalations, tenant, family, outcome).inc()
        if wasted is not None:
            for kind, tokens in zip(("prompt", "completion"), wasted, strict=True):
                metrics.labelled(metrics.auto_wasted_tokens, tenant, family, kind).inc(tokens)

    def quota_admitted(self, tenant: str, source: str) -> None:
        self._metrics.labelled(self._metrics.quota_admissions, tenant, source).inc()

    def continued(self) -> None:
        self._metrics.labelled(self._metrics.failovers, "continuation").inc()

    def priced(self, tenant: str, model: str, cost_usd: float) -> None:
        if cost_usd:
            self._metrics.labelled(self._metrics.cost, tenant, model).inc(cost_usd)

    def ended(self, ended: Any) -> None:
        metrics = self._metrics
        streamed = "true" if ended.stream else "false"
        metrics.labelled(metrics.requests, ended.tenant, ended.model, ended.region, ended.status).inc()
        if self._counting:
            return
        metrics.labelled(metrics.latency, ended.model, streamed).observe(ended.total_s)
        metrics.labelled(metrics.overhead, ended.model, streamed).observe(ended.gateway_s)
        usage = ended.usage
        if usage is not None:
            for kind, count in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens)):
                if count:
                    metrics.labelled(metrics.tokens, ended.tenant, kind).inc(count)

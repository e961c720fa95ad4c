"""The router's data model: tenants' policies, the fleet as routing sees it, and decisions.

Plain frozen dataclasses with no I/O, shared by the gateway (which fills them from YAML, the
region directory and load reports) and by the pure routing functions.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from protocol.capabilities import NODE_CAPABILITIES
from protocol.first_token import StepCost

ModelTier = Literal["small", "large"]
TrafficTier = Literal["interactive", "batch"]
FailMode = Literal["open", "closed"]
PrefixCacheMode = Literal["shared", "isolated"]
TargetKind = Literal["node", "provider"]

# A model name that lets the router choose the tier (see router.tiers).
AUTO_MODEL = "auto"


@dataclass(frozen=True)
class Residency:
    """Where a tenant's data may be processed. Empty sets on both sides mean anywhere.

    When both are given, a target must satisfy both (region in `regions` and jurisdiction in
    `jurisdictions`): residency only ever narrows.
    """

    jurisdictions: frozenset[str] = frozenset()
    regions: frozenset[str] = frozenset()

    def allows(self, region: str, jurisdiction: str) -> bool:
        if self.jurisdictions and jurisdiction not in self.jurisdictions:
            return False
        return not (self.regions and region not in self.regions)

    def describe(self) -> str:
        parts = []
        if self.jurisdictions:
            parts.append("jurisdictions " + ",".join(sorted(self.jurisdictions)))
        if self.regions:
            parts.append("regions " + ",".join(sorted(self.regions)))
        return " and ".join(parts) or "anywhere"


@dataclass(frozen=True)
class TenantLimits:
    """Per-tenant limits; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_requests: int | None = None
    daily_tokens: int | None = None
    max_tokens: int | None = None  # cap on a request's max_tokens
    context_tokens: int | None = None  # cap on prompt + max_tokens


@dataclass(frozen=True)
class EscalationOverrides:
    """A tenant's `escalation:` in its policy: replaces the gateway's `auto.escalation` defaults
    field by field (None: the gateway's value), see router.confidence.rule_for."""

    threshold: float | None = None
    k_tokens: int | None = None
    window: int | None = None


@dataclass(frozen=True)
class TenantPolicy:
    tenant_id: str
    api_key_hashes: frozenset[str]  # hex SHA-256 of each key
    models: frozenset[str] = frozenset({"*"})  # logical model names; "*" allows all
    residency: Residency = field(default_factory=Residency)
    traffic_tier: TrafficTier = "interactive"
    limits: TenantLimits = field(default_factory=TenantLimits)
    allow_commercial: bool = False
    allow_degrade: bool = False
    fail_mode: FailMode = "open"  # what quotas do when Redis is unreachable
    prefix_cache: PrefixCacheMode = "shared"  # "isolated": the node salts this tenant's cache
    # Prompt and completion text may go into traces (OpenTelemetry); off, only sizes and ids do.
    trace_content: bool = False
    escalation: EscalationOverrides = field(default_factory=EscalationOverrides)  # `auto` cascade

    def allows_model(self, model: str) -> bool:
        return "*" in self.models or model in self.models


@dataclass(frozen=True)
class CatalogModel:
    """A logical model name clients use, and its tier."""

    name: str
    tier: ModelTier
    description: str = ""


@dataclass(frozen=True)
class ModelVersion:
    """The version of a model a node serves, and a hash of the checkpoint it loaded."""

    version: str
    checkpoint: str = ""  # "" when the node did not say


@dataclass(frozen=True)
class Rollout:
    """A catalog model's rollout plan: (version, weight) pairs in the order the config lists them.

    router.rollout.choose_version reads it; weights are relative (they need not sum to 100).
    """

    weights: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(weight for _, weight in self.weights)


@dataclass(frozen=True)
class ModelQueue:
    """One model's queue on a node (the per-model entry of `/load`), as admission reads it."""

    waiting_tokens: int = 0  # every tier's
    waiting_tokens_by_tier: Mapping[str, int] = field(default_factory=dict)  # empty: not reported
    queue_bound_tokens: Mapping[str, int] = field(default_factory=dict)  # per tier; absent: unbounded
    drain_tokens_per_s: float = 0.0  # 0: not measured yet
    # The node's own estimate of a new request's time to first token, per tier; empty: not reported.
    first_token_s_by_tier: Mapping[str, float] = field(default_factory=dict)
    # The estimate's inputs (protocol/first_token.py), so admission can add its own admissions.
    # An unmeasured step_cost: a node that reports none (older, or not stepped yet).
    waiting_requests_by_tier: Mapping[str, int] = field(default_factory=dict)
    num_running: int = 0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int = 0
    long_prefill_token_threshold: int = 0
    step_cost: StepCost = field(default_factory=StepCost)
    finish_rate: float = 0.0
    # Seconds the oldest waiting request has waited, per tier (absent: none waiting).
    queue_age_s_by_tier: Mapping[str, float] = field(default_factory=dict)

    @functools.cached_property
    def derived(self) -> dict[Any, Any]:
        """What routing derives from this report, computed once per report rather than once per
        request (router/overload.py): a report is immutable, so nothing here goes stale."""
        return {}


@dataclass(frozen=True)
class NodeLoad:
    """A node's `/load` report, as routing uses it."""

    kv_cache_usage: float = 0.0  # 0..1
    waiting_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    models: Mapping[str, ModelQueue] = field(default_factory=dict)  # by logical model name
    versions: Mapping[str, ModelVersion] = field(default_factory=dict)  # by model; empty: not reported
    # When the report was asked for (the gateway's time.monotonic()): requests admitted after it
    # cannot be in it (router/overload.py).
    asked_at: float = float("-inf")
    # Models failing their golden-output probes on the node (regional_node/probes): not routed to
    # it, as if it were unhealthy for those models only (router/candidates.py).
    probe_failed: frozenset[str] = frozenset()
    # The node's published prefix table: message-prefix name -> tokens it holds cached
    # (protocol/prefix_cache.py); empty: nothing published. Read-only: readers share it.
    cached_prefixes: Mapping[str, int] = field(default_factory=dict)
    # Of those, the ones a request on the node is still computing (not in its cache yet).
    computing_prefixes: frozenset[str] = frozenset()
    # The requests this gateway sent to the node lately, summed (its overlay, kept by
    # gateway/health/probes.py): a supplement to the report, never a replacement (router/cost.py).
    overlay: Overlaid | None = None

    @functools.cached_property
    def derived(self) -> dict[Any, Any]:
        """What routing derives from this report, once per report (router/load.py). Nothing in
        it reads `overlay`: copies of one report with other overlays share it (`with_overlay`)."""
        return {}

    def with_overlay(self, overlay: Overlaid | None) -> NodeLoad:
        """This report with another overlay. The gateway makes one per request routed to the node
        (its overlay changed); sharing `derived` keeps what routing derives from the report
        derived once per report, not once per request."""
        copy = replace(self, overlay=overlay)
        copy.__dict__["derived"] = self.derived  # where cached_property keeps it
        return copy


@dataclass(frozen=True)
class Prefill:
    """What one request asks of the node it goes to, for the gateway's overlay: the prompt
    tokens the node computes, and the message prefixes it will hold once they are computed."""

    # Prefix name (protocol/prefix_cache.py) -> the tokens it covers, as routing estimated them.
    prefixes: Mapping[str, int]
    uncached_tokens: int  # what the node prefills: the prompt less what it held


RoutedStage = Literal["waiting", "running", "done"]


# Compared by identity: the gateway's overlay finds a request's entry among dozens by it.
@dataclass(frozen=True, eq=False)
class Routed:
    """A request this gateway routed to a node, with when (the gateway's time.monotonic(),
    comparable with NodeLoad.asked_at): a report asked before then cannot show it."""

    prefill: Prefill
    routed_at: float
    key: str = ""  # what the gateway names it by when the node answers (its call and model)
    # waiting: no first token yet (queued, or prefilling); running: answered (its first token),
    # still generating; done: its answer ended. Answered, its prompt is computed: the prefixes
    # it names are in the node's cache.
    stage: RoutedStage = "waiting"


@dataclass(frozen=True)
class Overlaid:
    """The requests a gateway routed to one node lately, as routing reads them (router/cost.py,
    `overlaid` says exactly what they sum): every one's prefixes, each with the most tokens any of
    them gave it, and how many were sent since the node's report was asked, with the tokens they
    prefill. Sums, not the requests: a busy gateway keeps dozens per node, and routing reads them
    on every request. A request the node has answered waits no more: it counts as one of the
    node's running sequences until its answer ends (`unreported_running`), then as nothing, and
    the prefixes it named are `prefilled` (cached there, where the others are still computing)."""

    prefixes: Mapping[str, int] = field(default_factory=dict)
    unreported: int = 0
    unreported_tokens: int = 0
    unreported_running: int = 0
    prefilled: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NodeInfo:
    """A regional node as the region directory (static file or Consul) and health see it."""

    node_id: str
    url: str  # base URL, e.g. http://127.0.0.1:9001
    region: str
    jurisdiction: str
    models: frozenset[str]  # logical model names it serves
    healthy: bool = True
    load: NodeLoad | None = None
    # By model, as the directory states it (regions file, Consul meta); the node's own /load
    # report wins where it has one (router.rollout.node_version).
    versions: Mapping[str, ModelVersion] = field(default_factory=dict)
    # What it serves beyond text generation (protocol/capabilities.py): Meridian's node software.
    capabilities: frozenset[str] = NODE_CAPABILITIES


@dataclass(frozen=True)
class ProviderInfo:
    """A commercial API endpoint (OpenAI, Anthropic) that may serve some models."""

    provider_id: str
    kind: Literal["openai", "anthropic"]
    region: str
    jurisdiction: str
    models: frozenset[str]  # logical model names it may serve
    healthy: bool = True  # false while its circuit breaker is open
    # What its adapter passes on beyond text generation (protocol/capabilities.py).
    capabilities: frozenset[str] = frozenset()


@dataclass(frozen=True)
class FleetSnapshot:
    nodes: tuple[NodeInfo, ...] = ()
    providers: tuple[ProviderInfo, ...] = ()


@dataclass(frozen=True)
class RouteRequest:
    """What routing needs to know about one request."""

    model: str  # logical model name, already resolved from "auto"
    home_region: str  # the gateway's region
    client_region: str | None = None  # x-meridian-client-region
    affinity_key: str = ""  # start of the prompt, for prefix-cache affinity
    exclude: frozenset[str] = frozenset()  # target ids already tried (retries)
    # Set when admission sent the request to `model` (the small tier) because the pool of this
    # model, the one it asked for, was over its traffic tier's target: reasons say "degraded".
    degraded_from: str | None = None
    # The rollout's sticky key: the request's `user` or session header; empty: the affinity key.
    session_key: str = ""
    # Set on a stream continuation: only targets serving this version of `model` (never mixed).
    version: str | None = None
    # The conversation as (role, text) pairs (protocol.prefix_cache.conversation_of), to find the
    # nodes holding its prefixes; empty: no cache is known to help (a completion prompt).
    conversation: tuple[tuple[str, str], ...] = ()
    prompt_tokens: int = 0  # the gateway's estimate; 0: estimated from the conversation's bytes
    # The capabilities the request asks for (protocol/capabilities.py): only targets serving all
    # of them are routed to.
    needs: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Target:
    kind: TargetKind
    target_id: str  # node_id or provider_id
    url: str
    region: str
    jurisdiction: str
    model: str
    reason: str  # why it is in this position, for x-meridian-route and traces
    version: str = ""  # the model version the target advertises; "" when unknown (providers)


@dataclass(frozen=True)
class RouteDecision:
    """Ordered targets to try; empty with `unavailable_reason` when none may serve."""

    targets: tuple[Target, ...]
    reason: str
    unavailable_reason: str | None = None
    version: str | None = None  # the rollout version chosen for the model; None: no rollout
    # What the first target computes for the request (a node target, a chat request); the gateway
    # keeps it in its overlay for that node until the node's own reports show it.
    prefill: Prefill | None = None
    # With no target: the capabilities the request asks that no target the tenant may use
    # serves, healthy or not (a client's error: nothing here will ever serve the request as asked).
    unsupported: tuple[str, ...] = ()

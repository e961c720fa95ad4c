"""The router: pure functions from (request, tenant policy, fleet snapshot) to ordered targets."""

from router.affinity import rendezvous_rank
from router.errors import ModelNotAllowedError, RoutingError, UnknownModelError
from router.overload import PoolWait, node_wait_s, pool_wait
from router.params import DEFAULT_PARAMS, RoutingParams
from router.retry import MAX_ATTEMPTS_BOUND, RetryPolicy, backoff_delays, next_targets
from router.route import route
from router.tiers import DEFAULT_AUTO_RULE, AutoRule, auto_tier, degrade_model, resolve_model
from router.types import (
    AUTO_MODEL,
    CatalogModel,
    FleetSnapshot,
    ModelQueue,
    NodeInfo,
    NodeLoad,
    ProviderInfo,
    Residency,
    RouteDecision,
    RouteRequest,
    Target,
    TenantLimits,
    TenantPolicy,
)

__all__ = [
    "AUTO_MODEL",
    "DEFAULT_AUTO_RULE",
    "DEFAULT_PARAMS",
    "MAX_ATTEMPTS_BOUND",
    "AutoRule",
    "CatalogModel",
    "FleetSnapshot",
    "ModelNotAllowedError",
    "ModelQueue",
    "NodeInfo",
    "NodeLoad",
    "PoolWait",
    "ProviderInfo",
    "Residency",
    "RetryPolicy",
    "RouteDecision",
    "RouteRequest",
    "RoutingError",
    "RoutingParams",
    "Target",
    "TenantLimits",
    "TenantPolicy",
    "UnknownModelError",
    "auto_tier",
    "backoff_delays",
    "degrade_model",
    "next_targets",
    "node_wait_s",
    "pool_wait",
    "rendezvous_rank",
    "resolve_model",
    "route",
]

"""Health of every upstream: one circuit breaker per target (node, provider endpoint, the quota
store), a board of them shared between replicas through Redis, and the nodes' active probes."""

from gateway.health.board import BreakerBoard, build_board
from gateway.health.breaker import BreakerState, CircuitBreaker, Outcome, Permit, Rejection
from gateway.health.config import BreakerConfig, ConsecutiveFailures, Cooldown, RollingWindow, ejection
from gateway.health.metrics import BreakerMetrics
from gateway.health.shared import RedisBreakerStore, RemoteMarks, SharedBreakerStore, SharedStoreUnavailable

__all__ = [
    "BreakerBoard",
    "BreakerConfig",
    "BreakerMetrics",
    "BreakerState",
    "CircuitBreaker",
    "ConsecutiveFailures",
    "Cooldown",
    "Outcome",
    "Permit",
    "RedisBreakerStore",
    "Rejection",
    "RemoteMarks",
    "RollingWindow",
    "SharedBreakerStore",
    "SharedStoreUnavailable",
    "build_board",
    "ejection",
]

"""Circuit breakers per target (provider endpoint or node), optionally shared through Redis."""

from gateway.health.board import BreakerBoard
from gateway.health.config import BreakerConfig
from gateway.health.guard import AttemptObserver, AttemptReport, GuardedUpstream, TargetUnavailableError
from gateway.health.metrics import BreakerMetrics
from gateway.health.shared import RedisBreakerStore, RemoteMarks, SharedBreakerStore, SharedStoreUnavailable
from gateway.health.state import BreakerState, CircuitBreaker, Outcome, Permit, Rejection

__all__ = [
    "AttemptObserver",
    "AttemptReport",
    "BreakerBoard",
    "BreakerConfig",
    "BreakerMetrics",
    "BreakerState",
    "CircuitBreaker",
    "GuardedUpstream",
    "Outcome",
    "Permit",
    "RedisBreakerStore",
    "Rejection",
    "RemoteMarks",
    "SharedBreakerStore",
    "SharedStoreUnavailable",
    "TargetUnavailableError",
]

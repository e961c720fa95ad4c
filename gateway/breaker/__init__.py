"""Circuit breakers per target (provider endpoint or node), optionally shared through Redis."""

from gateway.breaker.board import BreakerBoard
from gateway.breaker.config import BreakerConfig
from gateway.breaker.guard import AttemptObserver, AttemptReport, GuardedUpstream, TargetUnavailableError
from gateway.breaker.metrics import BreakerMetrics
from gateway.breaker.shared import RedisBreakerStore, RemoteMarks, SharedBreakerStore, SharedStoreUnavailable
from gateway.breaker.state import BreakerState, CircuitBreaker, Outcome, Permit, Rejection

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

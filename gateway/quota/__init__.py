"""Distributed token quotas: exact across gateway replicas (Redis) or in-process (`make up`).

`build_quota_gate(config.quota)` is the entry point; see README.md for the algorithm.
"""

from gateway.quota.build import build_quota_gate
from gateway.quota.config import QuotaConfig
from gateway.quota.errors import (
    QuotaError,
    QuotaExceeded,
    QuotaStoreUnavailable,
    QuotaUnavailable,
    RequestTooLarge,
)
from gateway.quota.gate import StoreQuotaGate, store_breaker
from gateway.quota.interface import Admission, QuotaGate
from gateway.quota.lease import LeaseKeeper
from gateway.quota.memory_store import MemoryQuotaStore
from gateway.quota.model import QuotaLimits
from gateway.quota.redis_store import RedisQuotaStore
from gateway.quota.window import Geometry

__all__ = [
    "Admission",
    "Geometry",
    "LeaseKeeper",
    "MemoryQuotaStore",
    "QuotaConfig",
    "QuotaError",
    "QuotaExceeded",
    "QuotaGate",
    "QuotaLimits",
    "QuotaStoreUnavailable",
    "QuotaUnavailable",
    "RedisQuotaStore",
    "RequestTooLarge",
    "StoreQuotaGate",
    "build_quota_gate",
    "store_breaker",
]

"""Distributed token quotas: exact across gateway replicas (Redis) or in-process (`make up`).

`build_quota_gate(config_section)` is the entry point; see README.md for the algorithm.
"""

from gateway.quota.build import build_quota_gate
from gateway.quota.config import QuotaConfig, parse_quota_config
from gateway.quota.errors import QuotaConfigError, QuotaError, QuotaStoreUnavailable
from gateway.quota.gate import StoreQuotaGate, store_breaker
from gateway.quota.interface import Admission, QuotaGate
from gateway.quota.lease import lease_keeper
from gateway.quota.memory_store import MemoryQuotaStore
from gateway.quota.model import QuotaLimits
from gateway.quota.redis_store import RedisQuotaStore
from gateway.quota.window import Geometry

__all__ = [
    "Admission",
    "Geometry",
    "MemoryQuotaStore",
    "QuotaConfig",
    "QuotaConfigError",
    "QuotaError",
    "QuotaGate",
    "QuotaLimits",
    "QuotaStoreUnavailable",
    "RedisQuotaStore",
    "StoreQuotaGate",
    "build_quota_gate",
    "lease_keeper",
    "parse_quota_config",
    "store_breaker",
]

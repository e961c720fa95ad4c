"""Building the gate the gateway's config asks for."""

from __future__ import annotations

from gateway.quota.config import QuotaConfig
from gateway.quota.gate import StoreQuotaGate, store_breaker
from gateway.quota.memory_store import MemoryQuotaStore
from gateway.quota.redis_store import RedisQuotaStore, connect
from gateway.quota.store import Outbox


def build_quota_gate(config: QuotaConfig, outbox: Outbox | None = None) -> StoreQuotaGate:
    """No `redis_url` -> in-process store; with one -> Redis, with an in-process fail-open
    fallback. Opens no connection yet (the first call does), so it is safe to call outside an
    event loop. Usage events settled in-process (and those Redis could not take) go to `outbox`."""
    if config.redis_url is None:
        return StoreQuotaGate(
            MemoryQuotaStore(outbox=outbox), lease_ms=config.lease_ms, local_share=config.local_share
        )
    timeout_s, congested_s = config.timeout_ms / 1000, config.congested_timeout_ms / 1000
    client = connect(
        config.redis_url,
        timeout_s=congested_s,
        max_connections=config.max_connections,
        cluster=config.cluster,
    )
    return StoreQuotaGate(
        RedisQuotaStore(client, key_prefix=config.key_prefix, timeout_s=timeout_s, congested_s=congested_s),
        fallback=MemoryQuotaStore(name="local", outbox=outbox),
        breaker=store_breaker(config.cooldown_ms / 1000),
        lease_ms=config.lease_ms,
        local_share=config.local_share,
        outbox=outbox,
    )

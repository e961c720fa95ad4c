"""Redis key names of one tenant's quota state.

Every key carries the tenant in a Redis Cluster hash tag (`mq:{acme}:tokens`), so all of them
hash to one slot and each script, which names all its keys in KEYS, runs on a single node.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def hash_tag(tenant_id: str) -> str:
    """The tenant's tag. Cluster hashes the text between the first '{' and the next '}', so an id
    containing a brace would split the tag; such ids (and empty ones) use a digest instead."""
    if tenant_id and "{" not in tenant_id and "}" not in tenant_id:
        return tenant_id
    return "h-" + hashlib.sha256(tenant_id.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class TenantKeys:
    requests: str  # hash: bucket index -> admitted requests
    tokens: str  # hash: bucket index -> reserved/charged tokens
    leases: str  # sorted set: lease id -> expiry (ms, server time)
    daily: str  # hash: {day, used}
    usage: str  # stream: the usage events the settlement script appends (gateway/ledger)

    @classmethod
    def for_tenant(cls, prefix: str, tenant_id: str) -> TenantKeys:
        base = f"{prefix}:{{{hash_tag(tenant_id)}}}"
        return cls(
            requests=f"{base}:requests",
            tokens=f"{base}:tokens",
            leases=f"{base}:leases",
            daily=f"{base}:daily",
            usage=f"{base}:usage",
        )

    def all(self) -> tuple[str, str, str, str]:
        """In the order the scripts expect them as KEYS."""
        return (self.requests, self.tokens, self.leases, self.daily)

"""The gateway config's `quota` section as a typed struct (validated with the rest of the file).

quota:                      # absent or {} -> in-process store (one replica, `make up`)
  redis_url: redis://127.0.0.1:6379/0
  timeout_ms: 200           # bound on every Redis call, connect included ...
  congested_timeout_ms: 2000  # ... stretched up to this only while the gateway's own loop lags
  cooldown_ms: 1000         # after a Redis failure, skip it this long, then probe once
  local_share: 0.25         # fail-open: each replica enforces this share of every limit
  key_prefix: mq
  lease_ms: 30000           # concurrency lease; renewed every lease_ms / 3 while streaming
  max_connections: 64       # Redis connections per gateway process
  cluster: false            # redis_url names a Redis Cluster node
"""

from __future__ import annotations

from typing import Annotated

import msgspec

_URL_SCHEMES = ("redis://", "rediss://", "unix://")


class QuotaConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    redis_url: str | None = None
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 200
    congested_timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=60_000)] = 2_000
    cooldown_ms: Annotated[int, msgspec.Meta(ge=0, le=600_000)] = 1_000
    local_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    # Braces would break the tenant's hash tag, which must be the first {...} in every key.
    key_prefix: Annotated[str, msgspec.Meta(pattern=r"^[^{}]+$")] = "mq"
    lease_ms: Annotated[int, msgspec.Meta(ge=100, le=3_600_000)] = 30_000
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 64
    cluster: bool = False

    def __post_init__(self) -> None:
        # Rules the types cannot express; "field: why", which the config loader puts under $.quota.
        if self.redis_url is not None and not self.redis_url.startswith(_URL_SCHEMES):
            # Only the scheme: the rest of the URL may hold the Redis password.
            scheme = self.redis_url.partition("://")[0] if "://" in self.redis_url else "no scheme"
            raise ValueError(f"redis_url: expected a redis://, rediss:// or unix:// URL, got {scheme!r}")
        if self.congested_timeout_ms < self.timeout_ms:
            raise ValueError("congested_timeout_ms: must be at least quota.timeout_ms")
        if self.cluster and self.redis_url is None:
            raise ValueError("cluster: needs quota.redis_url")

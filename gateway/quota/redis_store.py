"""The shared quota store: one Lua script per operation, one Redis round trip each.

Every call is bounded by `timeout_s` as a whole (connection checkout, connect, the NOSCRIPT
reload path included; stretched up to `congested_s` only while the gateway's own event loop is
congested, see deadline.py) and any Redis or socket failure becomes QuotaStoreUnavailable, so
the gate can apply the tenant's fail_mode. redis-py's own retries are off: a retry would double the
worst-case wait, and a retried EVALSHA whose first reply was lost would reserve twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.quota.deadline import LoopLag, ReplyClock, within
from gateway.quota.errors import QuotaStoreUnavailable
from gateway.quota.keys import TenantKeys
from gateway.quota.model import AdmitOutcome, QuotaLimits, UsageReading
from gateway.quota.scripts import LuaScript, QuotaScripts
from gateway.quota.store import Clock
from gateway.quota.window import Geometry

logger = logging.getLogger(__name__)
_SCRIPTS = QuotaScripts()


def _limit(value: int | None) -> int:
    return -1 if value is None else value


def connect(url: str, *, timeout_s: float, max_connections: int = 64, cluster: bool = False) -> Any:
    """A redis.asyncio client whose every socket operation gives up after `timeout_s`.

    RedisQuotaStore passes its congested-loop limit here: its own deadline is the real bound,
    these socket timeouts only a backstop that must not fire first (they measure loop time too).
    """
    options: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
    }
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url, max_connections=max_connections, **options)
    # A bounded pool: under a burst, requests queue for a connection (within the timeout) instead
    # of opening one socket per in-flight request.
    pool = BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=timeout_s, **options)
    return Redis.from_pool(pool)  # the client owns the pool and closes it


class RedisQuotaStore:
    name = "redis"

    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = "mq",
        timeout_s: float = 0.1,
        congested_s: float = 1.0,
        geometry: Geometry | None = None,
        clock: Clock | None = None,
    ):
        self._client = client
        self._prefix = key_prefix
        self._timeout_s = timeout_s
        self._congested_s = congested_s
        self._lag = LoopLag()
        self._replies = ReplyClock()
        self._geo = geometry or Geometry()
        # Tests only: pass their own time instead of Redis TIME.
        self._clock = clock

    @property
    def client(self) -> Any:
        return self._client

    def keys(self, tenant_id: str) -> TenantKeys:
        return TenantKeys.for_tenant(self._prefix, tenant_id)

    def _now_arg(self) -> str | int:
        return "" if self._clock is None else self._clock()

    async def _run(
        self, script: LuaScript, keys: tuple[str, ...], args: tuple[str | int | bytes, ...]
    ) -> Any:
        try:
            reply = await within(
                lambda: _SCRIPTS.run(self._client, script, keys, args),
                self._timeout_s,
                self._congested_s,
                self._lag,
                self._replies,
            )
        except (RedisError, OSError, TimeoutError) as exc:
            raise QuotaStoreUnavailable(f"redis {script.name}: {type(exc).__name__}: {exc}") from exc
        self._replies.mark()
        return reply

    async def start(self, warm_connections: int = 16) -> None:
        """Load the scripts and open some connections before traffic arrives.

        A cold gateway hit by a burst would otherwise spend its first Redis calls connecting and
        loading scripts while its loop is busiest. Failures are only logged: Redis may come later.
        """
        self._lag.ensure_started()
        try:
            await within(lambda: _SCRIPTS.load_all(self._client), self._congested_s, self._congested_s)
            await within(
                lambda: asyncio.gather(*(self._client.ping() for _ in range(warm_connections))),
                self._congested_s,
                self._congested_s,
            )
            self._replies.mark()
        except (RedisError, OSError, TimeoutError) as exc:
            logger.warning("quota store not reachable at start-up (will retry per request): %s", exc)

    async def admit(
        self, tenant_id: str, limits: QuotaLimits, cost: int, lease_id: str, lease_ms: int
    ) -> AdmitOutcome:
        args = (
            self._now_arg(),
            self._geo.window_ms,
            self._geo.bucket_ms,
            _limit(limits.requests_per_minute),
            _limit(limits.tokens_per_minute),
            _limit(limits.concurrent_requests),
            _limit(limits.daily_tokens),
            cost,
            lease_id,
            lease_ms,
        )
        reply = [int(v) for v in await self._run(_SCRIPTS.admit, self.keys(tenant_id).all(), args)]
        return AdmitOutcome(
            admitted=reply[0] == 1,
            denied=reply[1],
            retry_after_ms=reply[2],
            requests_used=reply[3],
            requests_reset_ms=reply[4],
            tokens_used=reply[5],
            tokens_reset_ms=reply[6],
            concurrent_in_use=reply[7],
            daily_used=reply[8],
            slot=reply[9],
            day=reply[10],
            now_ms=reply[11],
        )

    async def settle(
        self, tenant_id: str, slot: int, day: int, delta: int, lease_id: str, event: bytes | None = None
    ) -> None:
        keys = self.keys(tenant_id)
        args: tuple[str | int | bytes, ...] = (
            self._now_arg(), self._geo.window_ms, self._geo.bucket_ms, slot, day, delta, lease_id
        )  # fmt: skip
        if event is None:
            await self._run(_SCRIPTS.settle, keys.all(), args)
        else:
            await self._run(_SCRIPTS.settle, (*keys.all(), keys.usage), (*args, event))

    async def renew(self, tenant_id: str, lease_id: str, lease_ms: int, limit: int) -> int:
        keys = (self.keys(tenant_id).leases,)
        return int(await self._run(_SCRIPTS.renew, keys, (self._now_arg(), lease_id, lease_ms, limit)))

    async def read(self, tenant_id: str) -> UsageReading:
        args = (self._now_arg(), self._geo.window_ms, self._geo.bucket_ms)
        reply = [int(v) for v in await self._run(_SCRIPTS.usage, self.keys(tenant_id).all(), args)]
        return UsageReading(
            requests_used=reply[0],
            requests_reset_ms=reply[1],
            tokens_used=reply[2],
            tokens_reset_ms=reply[3],
            concurrent_in_use=reply[4],
            daily_used=reply[5],
            now_ms=reply[6],
        )

    async def close(self) -> None:
        await self._lag.close()
        await self._client.aclose()

"""Breaker marks shared between gateway replicas through Redis.

Only the decisions are shared, not the rolling-window counts: "target X is open until T" and
"target X is throttled until T" (a provider's Retry-After). Each is a key holding the instant,
expiring at that instant, so a replica that dies leaves nothing behind. Every call is bounded by
a short timeout and failures raise `SharedStoreUnavailable`, which callers treat as "use local
state": Redis trouble must never hold up a request.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.health.breaker import Clock

Mark = Literal["open", "throttled"]

# Keep the later of the stored and the new instant; a replica must not shorten an opening that
# another replica made. One hash tag for every key, so MGET works on Redis Cluster as well.
_PUBLISH_SCRIPT = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


class SharedStoreUnavailable(Exception):
    """The shared store did not answer in time or answered with an error."""


@dataclass(frozen=True)
class RemoteMarks:
    open_until: float | None = None
    throttled_until: float | None = None


class SharedBreakerStore(Protocol):
    async def publish(self, target_id: str, mark: Mark, until: float) -> None: ...

    async def fetch(self, target_ids: Sequence[str]) -> dict[str, RemoteMarks]: ...

    async def aclose(self) -> None: ...


class RedisBreakerStore:
    """`SharedBreakerStore` on a redis.asyncio client; the caller closes it unless `owns_client`."""

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "meridian:{breaker}:",
        timeout_s: float = 0.1,
        clock: Clock = time.time,
        owns_client: bool = False,
    ) -> None:
        self._client = client
        self._owns_client = owns_client
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._clock = clock
        self._publish = client.register_script(_PUBLISH_SCRIPT)

    def _key(self, target_id: str, mark: Mark) -> str:
        return f"{self._prefix}{target_id}:{mark}"

    async def publish(self, target_id: str, mark: Mark, until: float) -> None:
        ttl_ms = math.ceil((until - self._clock()) * 1000)
        if ttl_ms <= 0:
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._publish(keys=[self._key(target_id, mark)], args=[repr(until), ttl_ms])
        except (RedisError, OSError, TimeoutError) as exc:
            raise SharedStoreUnavailable(f"publishing breaker mark failed: {exc!r}") from exc

    async def fetch(self, target_ids: Sequence[str]) -> dict[str, RemoteMarks]:
        if not target_ids:
            return {}
        keys = [self._key(t, mark) for t in target_ids for mark in ("open", "throttled")]
        try:
            async with asyncio.timeout(self._timeout_s):
                values = await self._client.mget(keys)
        except (RedisError, OSError, TimeoutError) as exc:
            raise SharedStoreUnavailable(f"reading breaker marks failed: {exc!r}") from exc
        marks = {}
        for i, target_id in enumerate(target_ids):
            open_until, throttled_until = (_instant(v) for v in values[2 * i : 2 * i + 2])
            if open_until is not None or throttled_until is not None:
                marks[target_id] = RemoteMarks(open_until, throttled_until)
        return marks

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _instant(value: bytes | str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # someone else's data under our prefix: ignore rather than fail requests

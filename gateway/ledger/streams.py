"""Reading the tenants' usage streams in Redis with a consumer group.

Each tenant's settlement script appends its events to `{prefix}:{tenant}:usage`, a stream in the
tenant's hash slot (gateway/quota/keys.py), so on Redis Cluster the append is in the same script,
on the same shard, as the settlement. There is therefore no single key listing the streams (a
registry key would live in another slot). The worker finds them two ways:

- the tenants of the policy set, whose streams (and the consumer group) it creates up front with
  XGROUP CREATE ... MKSTREAM, so a new tenant's events are read from its first request;
- every `discover_interval_s`, a SCAN of every primary for `{prefix}:*:usage` streams, which finds
  tenants another gateway knows, or that were removed from the policy with events still unread.
  SCAN returns every key that exists for the whole scan; a stream is never deleted (acknowledged
  entries are XDELed, the empty stream stays), so a stream missed by one scan is found by the next.

Delivery is at least once: entries are XACKed (and XDELed) only after the store committed them.
Entries another consumer read and never acknowledged (a worker or gateway killed mid-batch) are
taken over with XAUTOCLAIM once idle for `claim_idle_ms`; the store ignores request ids it has.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import RedisError, ResponseError

from gateway.ledger.source import Delivery
from gateway.quota.keys import TenantKeys

logger = logging.getLogger(__name__)

FIELD = "e"  # the one field of a stream entry: the event's JSON


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


class RedisStreams:
    def __init__(
        self,
        client: Any,
        *,
        key_prefix: str = "mq",
        group: str = "meridian-ledger",
        consumer: str | None = None,
        tenants: Callable[[], Iterable[str]] = tuple,
        discover_interval_s: float = 10.0,
        claim_idle_ms: int = 30_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._prefix = key_prefix
        self._group = group
        self.consumer = consumer or default_consumer_name()
        self._tenants = tenants
        self._discover_interval_s = discover_interval_s
        self._claim_idle_ms = claim_idle_ms
        self._clock = clock
        self._streams: set[str] = set()
        self._grouped: set[str] = set()
        self._next_discovery = 0.0
        self._next_claim = 0.0

    @property
    def streams(self) -> frozenset[str]:
        return frozenset(self._streams)

    def stream_key(self, tenant_id: str) -> str:
        return TenantKeys.for_tenant(self._prefix, tenant_id).usage

    async def discover(self) -> None:
        """Policy tenants' streams plus every usage stream a SCAN finds; each gets the group."""
        found = {self.stream_key(t) for t in self._tenants()}
        async for key in self._client.scan_iter(match=f"{self._prefix}:*:usage", count=1000, _type="stream"):
            found.add(key.decode() if isinstance(key, bytes) else key)
        for key in found - self._grouped:
            try:
                # From "0": entries appended before the group existed are read too.
                await self._client.xgroup_create(key, self._group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._grouped.add(key)
        self._streams |= found

    async def read(self, max_events: int, wait_s: float) -> list[Delivery]:
        now = self._clock()
        if now >= self._next_discovery:
            await self.discover()
            self._next_discovery = now + self._discover_interval_s
        deliveries: list[Delivery] = []
        if now >= self._next_claim:
            deliveries += await self._claim(max_events)
            self._next_claim = now + self._claim_idle_ms / 2000
        for key in sorted(self._streams):
            if len(deliveries) >= max_events:
                break
            reply = await self._read_group(key, max_events - len(deliveries))
            deliveries += _deliveries(key, reply)
        if not deliveries and wait_s > 0:
            await asyncio.sleep(wait_s)
        return deliveries

    async def _read_group(self, key: str, count: int) -> Any:
        try:
            return await self._client.xreadgroup(self._group, self.consumer, {key: ">"}, count=count)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream was recreated without its group (a shard restarted empty): add it again.
            self._grouped.discard(key)
            await self._client.xgroup_create(key, self._group, id="0", mkstream=True)
            self._grouped.add(key)
            return await self._client.xreadgroup(self._group, self.consumer, {key: ">"}, count=count)

    async def _claim(self, max_events: int) -> list[Delivery]:
        """Entries read by a consumer that went silent (killed mid-batch) and never acknowledged,
        this consumer's own unacknowledged entries (a commit that failed) included."""
        out: list[Delivery] = []
        for key in sorted(self._streams):
            if len(out) >= max_events:
                break
            try:
                reply = await self._client.xautoclaim(
                    key, self._group, self.consumer, self._claim_idle_ms, "0-0", count=max_events - len(out)
                )
            except ResponseError as exc:
                if "NOGROUP" in str(exc):
                    continue
                raise
            entries = reply[1] if len(reply) > 1 else []
            out += [
                Delivery(_field(fields), (key, _text(entry_id)))
                for entry_id, fields in entries
                if fields  # an entry deleted while pending comes back empty
            ]
        return out

    async def ack(self, deliveries: list[Delivery]) -> None:
        by_stream: dict[str, list[str]] = {}
        for delivery in deliveries:
            key, entry_id = delivery.receipt
            by_stream.setdefault(key, []).append(entry_id)
        for key, ids in by_stream.items():
            await self._client.xack(key, self._group, *ids)
            # Committed and acknowledged: the entries are not needed any more.
            await self._client.xdel(key, *ids)

    async def close(self) -> None:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _field(fields: dict[Any, Any]) -> bytes:
    value = fields.get(FIELD.encode(), fields.get(FIELD, b""))
    return value if isinstance(value, bytes) else str(value).encode()


def _deliveries(key: str, reply: Any) -> list[Delivery]:
    """XREADGROUP's reply (RESP2 list or RESP3 dict) -> deliveries."""
    if not reply:
        return []
    streams = reply.items() if isinstance(reply, dict) else reply
    out: list[Delivery] = []
    for _, entries in streams:
        for entry_id, fields in entries:
            if fields:
                out.append(Delivery(_field(fields), (key, _text(entry_id))))
    return out


__all__ = ["FIELD", "RedisError", "RedisStreams", "default_consumer_name"]

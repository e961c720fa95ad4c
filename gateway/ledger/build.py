"""The gateway's ledger: its store, the in-process outbox, and the worker tasks it runs.

With `worker: embedded` each gateway runs a worker on the Redis usage streams (when the quota
store is Redis; gateways share the consumer group). Whatever the mode, a second worker drains the
in-process outbox (the in-process quota store's events, and those a settlement could not put in
Redis) into the store, since no other process can see them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.ledger.config import LedgerConfig, PostgresStoreConfig, SqliteStoreConfig
from gateway.ledger.outbox import LocalOutbox
from gateway.ledger.prices import PriceTable
from gateway.ledger.store.operations import LedgerStore
from gateway.ledger.streams import RedisStreams
from gateway.ledger.worker import LedgerWorker
from gateway.policy.keys import key_digest
from gateway.runtime.tasks import cancel_and_wait

if TYPE_CHECKING:
    from gateway.config import GatewayConfig

logger = logging.getLogger(__name__)


class LedgerConfigError(Exception):
    """The ledger store cannot be built from the config (e.g. the DSN variable is unset)."""


def build_store(config: LedgerConfig, env: Mapping[str, str]) -> LedgerStore:
    store = config.store
    if isinstance(store, SqliteStoreConfig):
        from gateway.ledger.store.sqlite import SqliteLedger

        return SqliteLedger(store.path)
    assert isinstance(store, PostgresStoreConfig)
    from gateway.ledger.store.postgres import PostgresLedger

    return PostgresLedger(postgres_dsn(store, env), pool_size=store.pool_size, timeout_s=store.timeout_s)


def postgres_dsn(store: PostgresStoreConfig, env: Mapping[str, str]) -> str:
    """The ledger database's DSN, from the variable the config names (it may hold a password)."""
    dsn = (env.get(store.dsn_env) or "").strip()
    if not dsn:
        raise LedgerConfigError(
            f"ledger.store.dsn_env: the variable {store.dsn_env} (the PostgreSQL DSN) is not set"
        )
    return dsn


def price_table(config: GatewayConfig) -> PriceTable:
    return PriceTable.build(
        config.price_table_version,
        ((e.name, e.price, e.provider_prices) for e in config.catalog),
        ((p.id, p.models) for p in config.providers.endpoints),
    )


def stream_source(config: GatewayConfig, tenants: Callable[[], Iterable[str]], client: Any) -> RedisStreams:
    ledger = config.ledger
    return RedisStreams(
        client,
        key_prefix=config.quota.key_prefix,
        group=ledger.consumer_group,
        tenants=tenants,
        discover_interval_s=ledger.discover_interval_s,
        claim_idle_ms=ledger.claim_idle_ms,
    )


def redis_client(config: GatewayConfig) -> Any:
    from gateway.quota.redis_store import connect

    assert config.quota.redis_url is not None
    # Its own small pool: the worker's reads never queue behind (or in front of) request traffic.
    return connect(config.quota.redis_url, timeout_s=5.0, max_connections=4, cluster=config.quota.cluster)


class Ledger:
    def __init__(
        self,
        config: LedgerConfig,
        store: LedgerStore,
        prices: PriceTable,
        *,
        outbox: LocalOutbox,
        streams: RedisStreams | None = None,
        redis: Any = None,
    ) -> None:
        self.config = config
        self.store = store
        self.prices = prices
        self.outbox = outbox
        self._operators = config.operator_digests()
        wait_s = config.poll_interval_ms / 1000
        self.outbox_worker = LedgerWorker(
            outbox, store, batch_size=config.batch_size, wait_s=wait_s, retention_days=config.retention_days
        )
        self.stream_worker = (
            LedgerWorker(streams, store, batch_size=config.batch_size, wait_s=wait_s) if streams else None
        )
        self._redis = redis
        self._tasks: list[asyncio.Task[None]] = []

    def is_operator(self, api_key: str) -> bool:
        return bool(self._operators) and key_digest(api_key) in self._operators

    async def start(self) -> None:
        try:
            await self.store.start()
        except Exception as exc:  # the workers retry; the API answers 503 meanwhile
            logger.warning("ledger store not reachable at start-up (will retry): %s", exc)
        self._tasks.append(asyncio.create_task(self.outbox_worker.run(), name="ledger-outbox"))
        if self.stream_worker is not None:
            self._tasks.append(asyncio.create_task(self.stream_worker.run(), name="ledger-streams"))

    async def catch_up(self) -> None:
        """Commit the in-process outbox now: a usage query right after a request sees it."""
        if len(self.outbox):
            await self.outbox_worker.drain(timeout_s=2.0)

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks.clear()
        try:
            await self.outbox_worker.drain(timeout_s=5.0)  # in-process events die with the process
        except Exception:
            logger.exception("ledger: could not commit %d in-process events at shutdown", len(self.outbox))
        if self._redis is not None:
            await self._redis.aclose()
        await self.store.close()


def build_ledger(
    config: GatewayConfig, outbox: LocalOutbox, tenants: Callable[[], Iterable[str]], env: Mapping[str, str]
) -> Ledger:
    store = build_store(config.ledger, env)
    streams, redis = None, None
    if config.ledger.worker == "embedded" and config.quota.redis_url is not None:
        redis = redis_client(config)
        streams = stream_source(config, tenants, redis)
    return Ledger(config.ledger, store, price_table(config), outbox=outbox, streams=streams, redis=redis)

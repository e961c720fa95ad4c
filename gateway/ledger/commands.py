"""What `meridian ledger` and `meridian usage export` run (meridian/cli.py parses their flags).

`meridian ledger --config gateway.yaml` is the external ledger worker (`ledger.worker: external`):
it reads the tenants' usage streams from the quota's Redis (or Redis Cluster) in the consumer
group, as embedded workers in gateways do, and commits to the configured store. Run one or more;
they share the work, and a killed one's unacknowledged entries are taken over after
`ledger.claim_idle_ms`.

`meridian usage export --config gateway.yaml --from 2026-11-01 --to 2026-12-01 [--tenant T]
--format csv|jsonl` writes the raw events of [from, to) for a billing system, oldest first.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, TextIO

import msgspec

from gateway.ledger.build import build_store, redis_client, stream_source
from gateway.ledger.store.sql import EVENT_COLUMNS
from gateway.ledger.worker import LedgerWorker

if TYPE_CHECKING:
    from gateway.config import GatewayConfig

logger = logging.getLogger(__name__)
EXPORT_PAGE = 5_000


def parse_instant(text: str) -> int:
    """ms since the epoch from `YYYY-MM-DD` (UTC midnight), an ISO 8601 time (UTC if no zone) or
    Unix seconds. ValueError names what was wrong."""
    text = text.strip()
    if text.isdigit():
        return int(text) * 1000
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD), an ISO 8601 time or Unix seconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


async def export_usage(
    config: GatewayConfig,
    env: Mapping[str, str],
    *,
    start_ms: int,
    end_ms: int,
    tenant: str | None,
    fmt: str,
    out: TextIO,
) -> int:
    store = build_store(config.ledger, env)
    await store.start()
    written = 0
    writer = csv.writer(out) if fmt == "csv" else None
    if writer is not None:
        writer.writerow(EVENT_COLUMNS)
    encoder = msgspec.json.Encoder()
    after: tuple[int, str] | None = None
    try:
        while True:
            page = await store.events(start_ms, end_ms, tenant, after=after, limit=EXPORT_PAGE)
            for event in page:
                if writer is not None:
                    writer.writerow(["" if v is None else v for v in msgspec.structs.astuple(event)])
                else:
                    out.write(encoder.encode(event).decode() + "\n")
            written += len(page)
            if len(page) < EXPORT_PAGE:
                return written
            after = (page[-1].ts_ms, page[-1].request_id)
    finally:
        await store.close()


async def run_ledger_worker(config: GatewayConfig, env: Mapping[str, str]) -> None:
    """Until SIGINT or SIGTERM; then the batch in hand is finished (or left unacknowledged)."""
    from gateway.policy import PolicyStore

    policies = PolicyStore(config.policies)
    policies.load()
    store = build_store(config.ledger, env)
    await store.start()
    client = redis_client(config)
    source = stream_source(config, lambda: (t.tenant_id for t in policies.current()), client)
    worker = LedgerWorker(
        source,
        store,
        batch_size=config.ledger.batch_size,
        wait_s=config.ledger.poll_interval_ms / 1000,
        retention_days=config.ledger.retention_days,
    )
    await policies.start()
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def stopping() -> None:
        # Cancelling interrupts a blocking stream read at once; the event also ends the run
        # should a library swallow the cancellation (a SIGTERM once went unheeded for a minute
        # while the worker sat in a Redis read).
        stop.set()
        if task is not None:
            task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping)
    logger.info("ledger worker %s started (store: %s)", source.consumer, store.name)
    try:
        await worker.run(stop)
        logger.info("ledger worker stopping: %d events committed", worker.stats.committed)
    except asyncio.CancelledError:
        logger.info("ledger worker stopping: %d events committed", worker.stats.committed)
    finally:
        await policies.stop()
        await client.aclose()
        await store.close()


def ledger_main(config_path: str) -> int:

    from gateway.config import ConfigError, load_config
    from gateway.ledger.build import LedgerConfigError
    from gateway.policy import PolicyError

    try:
        config = load_config(config_path)
        if config.quota.redis_url is None:
            print(
                "meridian ledger: quota.redis_url is not set; with the in-process quota store each "
                "gateway writes the ledger itself (ledger.worker: embedded)",
                file=sys.stderr,
            )
            return 2
        asyncio.run(run_ledger_worker(config, os.environ))
    except (ConfigError, PolicyError, LedgerConfigError) as exc:
        print(f"meridian ledger: {exc}", file=sys.stderr)
        return 2
    return 0


def export_main(
    config_path: str, start: str, end: str, tenant: str | None, fmt: str, output: str | None
) -> int:

    from gateway.config import ConfigError, load_config
    from gateway.ledger.build import LedgerConfigError

    try:
        start_ms, end_ms = parse_instant(start), parse_instant(end)
    except ValueError as exc:
        print(f"meridian usage export: --from/--to: {exc}", file=sys.stderr)
        return 2
    if end_ms <= start_ms:
        print("meridian usage export: --to must be after --from", file=sys.stderr)
        return 2
    try:
        config = load_config(config_path)
        with open(output, "w", encoding="utf-8", newline="") if output else sys.stdout as out:
            count = asyncio.run(
                export_usage(
                    config, os.environ, start_ms=start_ms, end_ms=end_ms, tenant=tenant, fmt=fmt, out=out
                )
            )
    except (ConfigError, LedgerConfigError) as exc:
        print(f"meridian usage export: {exc}", file=sys.stderr)
        return 2
    print(f"meridian usage export: {count} events", file=sys.stderr)
    return 0

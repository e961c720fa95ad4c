"""SQL both stores run (`%s` placeholders; SQLite's `?` are substituted), and the pure rollup math."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from gateway.ledger.event import UsageEvent
from gateway.ledger.store.interface import DIMENSIONS, WIDTH_MS, AggregateQuery, AggregateRow

EVENT_COLUMNS: tuple[str, ...] = tuple(UsageEvent.__struct_fields__)

SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS usage_events (
        request_id TEXT PRIMARY KEY,
        ts_ms BIGINT NOT NULL,
        tenant_id TEXT NOT NULL,
        api_key_id TEXT NOT NULL,
        model_requested TEXT NOT NULL,
        model TEXT NOT NULL,
        tier TEXT NOT NULL,
        region TEXT NOT NULL,
        jurisdiction TEXT NOT NULL,
        upstream TEXT NOT NULL,
        route_reason TEXT NOT NULL,
        status TEXT NOT NULL,
        stream BOOLEAN NOT NULL,
        prompt_tokens BIGINT NOT NULL,
        cached_tokens BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL,
        usage_estimated BOOLEAN NOT NULL,
        cost_usd DOUBLE PRECISION NOT NULL,
        price_version TEXT NOT NULL,
        total_ms DOUBLE PRECISION NOT NULL,
        gateway_overhead_ms DOUBLE PRECISION,
        ttft_ms DOUBLE PRECISION,
        queue_wait_ms DOUBLE PRECISION,
        prefill_ms DOUBLE PRECISION,
        decode_ms DOUBLE PRECISION,
        retries INTEGER NOT NULL,
        continuations INTEGER NOT NULL,
        degraded BOOLEAN NOT NULL,
        safety BOOLEAN NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS usage_events_ts ON usage_events (ts_ms, request_id)",
    "CREATE INDEX IF NOT EXISTS usage_events_tenant_ts ON usage_events (tenant_id, ts_ms, request_id)",
    """
    CREATE TABLE IF NOT EXISTS usage_rollups (
        width TEXT NOT NULL,
        bucket_ms BIGINT NOT NULL,
        tenant_id TEXT NOT NULL,
        model TEXT NOT NULL,
        region TEXT NOT NULL,
        api_key_id TEXT NOT NULL,
        requests BIGINT NOT NULL,
        input_tokens BIGINT NOT NULL,
        cached_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        cost_usd DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (width, tenant_id, bucket_ms, model, region, api_key_id)
    )
    """,
    "CREATE INDEX IF NOT EXISTS usage_rollups_all ON usage_rollups (width, bucket_ms)",
)

# Columns added to usage_events after its first release, with their type: each store adds the
# ones an existing database lacks when it opens (SQLite has no ADD COLUMN IF NOT EXISTS, so the
# stores check in their own way). A new database gets them the same way, so there is one path.
ADDED_COLUMNS: tuple[tuple[str, str], ...] = (("model_version", "TEXT NOT NULL DEFAULT ''"),)

# Each column's SQL type, as the schema declares it (PostgreSQL casts a packed batch's arrays to
# them: gateway/ledger/store/bulk.py).
EVENT_TYPES: tuple[str, ...] = tuple(
    {
        "request_id": "text", "ts_ms": "bigint", "tenant_id": "text", "api_key_id": "text",
        "model_requested": "text", "model": "text", "tier": "text", "region": "text",
        "jurisdiction": "text", "upstream": "text", "route_reason": "text", "status": "text",
        "stream": "boolean", "prompt_tokens": "bigint", "cached_tokens": "bigint",
        "completion_tokens": "bigint", "usage_estimated": "boolean", "cost_usd": "double precision",
        "price_version": "text", "total_ms": "double precision",
        "gateway_overhead_ms": "double precision", "ttft_ms": "double precision",
        "queue_wait_ms": "double precision", "prefill_ms": "double precision",
        "decode_ms": "double precision", "retries": "integer", "continuations": "integer",
        "degraded": "boolean", "safety": "boolean", "model_version": "text",
    }[column]
    for column in EVENT_COLUMNS
)  # fmt: skip

ROLLUP_COLUMNS = (
    "width", "bucket_ms", "tenant_id", "model", "region", "api_key_id",
    "requests", "input_tokens", "cached_tokens", "output_tokens", "cost_usd",
)  # fmt: skip
ROLLUP_TYPES = (
    "text", "bigint", "text", "text", "text", "text",
    "bigint", "bigint", "bigint", "bigint", "double precision",
)  # fmt: skip
_SUMS = ROLLUP_COLUMNS[6:]
# What a rollup row's deltas do when its bucket exists: they add to it.
ROLLUP_CONFLICT = (
    "ON CONFLICT (width, tenant_id, bucket_ms, model, region, api_key_id) DO UPDATE SET "
    + ", ".join(f"{c} = usage_rollups.{c} + excluded.{c}" for c in _SUMS)
)

RollupKey = tuple[str, int, str, str, str, str]


def event_row(event: UsageEvent) -> tuple[object, ...]:
    return msgspec.structs.astuple(event)


def unique_by_request(events: Iterable[UsageEvent]) -> list[UsageEvent]:
    seen: set[str] = set()
    out = []
    for event in events:
        if event.request_id not in seen:
            seen.add(event.request_id)
            out.append(event)
    return sorted(out, key=lambda e: e.request_id)  # one lock order for concurrent writers


def rollup_model(event: UsageEvent) -> str:
    """The served model; the requested one when nothing served the request."""
    return event.model if event.model != "-" else event.model_requested


def rollup_rows(events: Iterable[UsageEvent]) -> list[tuple[object, ...]]:
    """Each event added to its minute, hour and day bucket: the deltas the rollups are upserted with."""
    sums: dict[RollupKey, list[float]] = {}
    for e in events:
        for width, span in WIDTH_MS.items():
            key = (width, e.ts_ms - e.ts_ms % span, e.tenant_id, rollup_model(e), e.region, e.api_key_id)
            acc = sums.setdefault(key, [0, 0, 0, 0, 0.0])
            acc[0] += 1
            acc[1] += e.prompt_tokens
            acc[2] += e.cached_tokens
            acc[3] += e.completion_tokens
            acc[4] += e.cost_usd
    # Sorted: concurrent writers (several gateways' workers) lock rollup rows in one order.
    return [
        (*key, int(a[0]), int(a[1]), int(a[2]), int(a[3]), float(a[4])) for key, a in sorted(sums.items())
    ]


def aggregate_sql(query: AggregateQuery) -> tuple[str, list[object]]:
    dims = [d for d in DIMENSIONS if d in query.group_by]
    select = ", ".join(["bucket_ms", *dims, *(f"SUM({c})" for c in _SUMS)])
    where = "width = %s AND bucket_ms >= %s AND bucket_ms < %s"
    params: list[object] = [query.width, query.start_ms, query.end_ms]
    if query.tenant_id is not None:
        where += " AND tenant_id = %s"
        params.append(query.tenant_id)
    group = ", ".join(["bucket_ms", *dims])
    return f"SELECT {select} FROM usage_rollups WHERE {where} GROUP BY {group} ORDER BY {group}", params


def events_sql(
    start_ms: int, end_ms: int, tenant_id: str | None, after: tuple[int, str] | None, limit: int
) -> tuple[str, list[object]]:
    where = "ts_ms >= %s AND ts_ms < %s"
    params: list[object] = [start_ms, end_ms]
    if tenant_id is not None:
        where += " AND tenant_id = %s"
        params.append(tenant_id)
    if after is not None:
        where += " AND (ts_ms > %s OR (ts_ms = %s AND request_id > %s))"
        params += [after[0], after[0], after[1]]
    sql = f"SELECT {', '.join(EVENT_COLUMNS)} FROM usage_events WHERE {where} ORDER BY ts_ms, request_id LIMIT %s"
    return sql, [*params, limit]


def row_event(row: Sequence[object]) -> UsageEvent:
    # SQLite hands booleans back as 0/1; strict=False lets msgspec take them as bools.
    return msgspec.convert(dict(zip(EVENT_COLUMNS, row, strict=True)), UsageEvent, strict=False)


PURGE = (
    "DELETE FROM usage_events WHERE ts_ms < %s",
    "DELETE FROM usage_rollups WHERE width = '1m' AND bucket_ms < %s",
)


def aggregate_rows(query: AggregateQuery, rows: Iterable[Sequence[object]]) -> list[AggregateRow]:
    dims = [d for d in DIMENSIONS if d in query.group_by]
    out = []
    for row in rows:
        values = list(row)
        bucket, group, sums = values[0], values[1 : 1 + len(dims)], values[1 + len(dims) :]
        out.append(
            AggregateRow(
                bucket_ms=int(bucket),  # type: ignore[call-overload]
                group=tuple(zip(dims, (str(v) for v in group), strict=True)),
                requests=int(sums[0] or 0),  # type: ignore[call-overload]
                input_tokens=int(sums[1] or 0),  # type: ignore[call-overload]
                cached_tokens=int(sums[2] or 0),  # type: ignore[call-overload]
                output_tokens=int(sums[3] or 0),  # type: ignore[call-overload]
                cost_usd=float(sums[4] or 0.0),  # type: ignore[arg-type]
            )
        )
    return out

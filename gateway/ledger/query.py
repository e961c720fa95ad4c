"""Usage and costs queries: parameters in, store queries out, OpenAI-shaped pages back. Pure.

Shaped like OpenAI's organization usage (`/v1/organization/usage/completions`) and costs APIs:
`start_time` / `end_time` in Unix seconds, `bucket_width` 1m | 1h | 1d, `group_by`, `limit`
buckets per page and a `page` cursor. Without `start_time` (which OpenAI requires), the query is
the `limit` buckets before `end_time` (default: now). Buckets are aligned to UTC minutes, hours and
days (the rollups' edges): the first bucket is the one holding `start_time`, the last the one
holding the second before `end_time`. Every bad parameter is a BadUsageQuery naming it (400).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.ledger.errors import BadUsageQuery
from gateway.ledger.store.interface import WIDTH_MS, AggregateQuery, AggregateRow
from protocol.query import query_count

Kind = Literal["usage", "costs"]
DEFAULT_LIMIT = {"1m": 60, "1h": 24, "1d": 7}
MAX_LIMIT = {"1m": 1440, "1h": 168, "1d": 31}
MAX_RANGE_BUCKETS = 100_000  # one query's whole range, over all its pages
# group_by values each API takes, and the rollup dimension each one reads.
GROUPS: dict[Kind, dict[str, str]] = {
    "usage": {
        "model": "model",
        "region": "region",
        "api_key_id": "api_key_id",
        "api_key": "api_key_id",
        "tenant_id": "tenant_id",
    },
    "costs": {
        "model": "model",
        "line_item": "model",
        "region": "region",
        "api_key_id": "api_key_id",
        "api_key": "api_key_id",
        "tenant_id": "tenant_id",
    },
}
_SHARED = {"start_time", "end_time", "bucket_width", "group_by", "limit", "page", "tenant"}
ALLOWED: dict[Kind, frozenset[str]] = {"usage": frozenset(_SHARED | {"date"}), "costs": frozenset(_SHARED)}
PAGE_PREFIX = "page_"

Params = Mapping[str, Sequence[str]]


@dataclass(frozen=True)
class BucketQuery:
    kind: Kind
    width: str
    start_ms: int  # the whole range, aligned
    end_ms: int
    page_start_ms: int  # this page
    limit: int
    group_by: tuple[str, ...]  # as asked (names in the response)
    tenant: str | None  # as asked (`tenant=`); scoping decides what is read

    def page(self, tenant_id: str | None) -> tuple[AggregateQuery, str | None]:
        """The store query for this page, and the next page's cursor (None on the last page)."""
        span = WIDTH_MS[self.width]
        page_end = min(self.end_ms, self.page_start_ms + self.limit * span)
        dims = tuple(dict.fromkeys(GROUPS[self.kind][g] for g in self.group_by))
        query = AggregateQuery(self.width, self.page_start_ms, page_end, tenant_id, dims)  # type: ignore[arg-type]
        return query, (f"{PAGE_PREFIX}{page_end // 1000}" if page_end < self.end_ms else None)


@dataclass(frozen=True)
class DayQuery:
    date: str
    start_ms: int
    end_ms: int
    tenant: str | None


def normalise(params: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """`group_by[]=a&group_by[]=b` (OpenAI's SDK form), `group_by=a,b` and repeats, as one list."""
    out: dict[str, list[str]] = {}
    for key, values in params.items():
        name = key[:-2] if key.endswith("[]") else key
        out.setdefault(name, []).extend(values)
    return out


def _one(params: Params, name: str) -> str | None:
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadUsageQuery(name, f"'{name}' may be given once.")
    return values[0]


# The last second of the year 9999: later times overflow the stores' 64-bit milliseconds (an
# end_time of 10**20 was a 500).
LAST_TIME_S = 253_402_300_799


def _int(params: Params, name: str) -> int | None:
    """A whole number in ASCII digits (int() also takes "1_000", "+5" and other scripts' digits),
    from 0 to LAST_TIME_S."""
    text = _one(params, name)
    if text is None:
        return None
    value = query_count(text)
    if value is None or value > LAST_TIME_S:
        raise BadUsageQuery(
            name,
            f"'{name}' must be a whole number from 0 to {LAST_TIME_S} (Unix seconds for times), got {text[:40]!r}.",
        )
    return value


def _check_names(kind: Kind, params: Params) -> None:
    for name in params:
        if name not in ALLOWED[kind]:
            raise BadUsageQuery(
                name, f"Unknown parameter '{name}'. Allowed: {', '.join(sorted(ALLOWED[kind]))}."
            )


def is_day_query(params: Params) -> bool:
    return "date" in params


def parse_day(params: Params) -> DayQuery:
    _check_names("usage", params)
    for other in ("start_time", "end_time", "bucket_width", "group_by", "limit", "page"):
        if other in params:
            raise BadUsageQuery("date", f"'date' cannot be combined with '{other}'.")
    text = _one(params, "date") or ""
    try:
        day = dt.date.fromisoformat(text) if len(text) == 10 else None
    except ValueError:
        day = None
    if day is None:
        raise BadUsageQuery("date", f"'date' must be a day as YYYY-MM-DD, got {text!r}.")
    start = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000)
    return DayQuery(
        date=day.isoformat(), start_ms=start, end_ms=start + WIDTH_MS["1d"], tenant=_one(params, "tenant")
    )


def parse_buckets(kind: Kind, params: Params, *, now_s: int) -> BucketQuery:
    _check_names(kind, params)
    end = _int(params, "end_time")
    end = now_s if end is None else end
    width = _one(params, "bucket_width") or "1d"
    if width not in WIDTH_MS:
        raise BadUsageQuery("bucket_width", f"'bucket_width' must be 1m, 1h or 1d, got {width!r}.")
    span = WIDTH_MS[width]
    limit = _int(params, "limit")
    limit = DEFAULT_LIMIT[width] if limit is None else limit
    if not 1 <= limit <= MAX_LIMIT[width]:
        raise BadUsageQuery(
            "limit", f"'limit' must be 1 to {MAX_LIMIT[width]} buckets for bucket_width={width}."
        )
    start = _int(params, "start_time")
    end_ms = -(-end * 1000 // span) * span  # up to the next edge
    if start is None:
        # One page back from `end_time` (OpenAI requires start_time), ending with the bucket that
        # holds it: the last 7 days by default, today included; and every query the OpenAPI
        # document allows is one the gateway answers.
        start = end_ms // 1000 - limit * span // 1000
    if end <= start:
        raise BadUsageQuery("end_time", "'end_time' must be after 'start_time'.")
    start_ms = start * 1000 - (start * 1000) % span
    if (end_ms - start_ms) // span > MAX_RANGE_BUCKETS:
        raise BadUsageQuery(
            "end_time",
            f"'end_time' is too far from 'start_time': more than {MAX_RANGE_BUCKETS} buckets of {width}; "
            "use a wider bucket_width.",
        )
    group_by: list[str] = []
    for value in params.get("group_by", []):
        for name in (v.strip() for v in value.split(",")):
            if name not in GROUPS[kind]:
                raise BadUsageQuery(
                    "group_by", f"'group_by' cannot be {name!r}. Allowed: {', '.join(sorted(GROUPS[kind]))}."
                )
            if name not in group_by:
                group_by.append(name)
    page_start = start_ms
    cursor = _one(params, "page")
    if cursor is not None:
        page_start = _page_start(cursor, start_ms, end_ms, span)
    return BucketQuery(
        kind=kind,
        width=width,
        start_ms=start_ms,
        end_ms=end_ms,
        page_start_ms=page_start,
        limit=limit,
        group_by=tuple(group_by),
        tenant=_one(params, "tenant"),
    )


def _page_start(cursor: str, start_ms: int, end_ms: int, span: int) -> int:
    text = cursor.removeprefix(PAGE_PREFIX)
    seconds = query_count(text) if cursor.startswith(PAGE_PREFIX) else None
    value = seconds * 1000 if seconds is not None else None
    if value is None or value % span or not start_ms <= value < end_ms:
        raise BadUsageQuery(
            "page", "'page' must be a cursor from a previous answer's next_page, for the same query."
        )
    return value


def _group_fields(kind: Kind, group_by: Sequence[str], row: AggregateRow | None) -> dict[str, Any]:
    values = dict(row.group) if row is not None else {}
    fields: dict[str, Any] = {"project_id": None}
    if kind == "usage":
        fields.update(user_id=None, api_key_id=None, model=None, batch=None)
    else:
        fields.update(line_item=None)
    fields.update(region=None, tenant_id=None)
    for name in group_by:
        fields[name if name != "api_key" else "api_key_id"] = values.get(GROUPS[kind][name])
    if kind == "costs" and "line_item" in group_by:
        fields["line_item"] = values.get("model")
    return fields


def page_body(
    query: BucketQuery, store_query: AggregateQuery, rows: Sequence[AggregateRow], next_page: str | None
) -> dict[str, Any]:
    span = WIDTH_MS[query.width]
    by_bucket: dict[int, list[AggregateRow]] = {}
    for row in rows:
        by_bucket.setdefault(row.bucket_ms, []).append(row)
    data = []
    for bucket in range(store_query.start_ms, store_query.end_ms, span):
        results = [_result(query, row) for row in by_bucket.get(bucket, [])]
        data.append(
            {
                "object": "bucket",
                "start_time": bucket // 1000,
                "end_time": (bucket + span) // 1000,
                "results": results,
            }
        )
    return {"object": "page", "data": data, "has_more": next_page is not None, "next_page": next_page}


def _result(query: BucketQuery, row: AggregateRow) -> dict[str, Any]:
    if query.kind == "usage":
        return {
            "object": "organization.usage.completions.result",
            "input_tokens": row.input_tokens,
            "input_cached_tokens": row.cached_tokens,
            "output_tokens": row.output_tokens,
            "input_audio_tokens": 0,
            "output_audio_tokens": 0,
            "num_model_requests": row.requests,
            **_group_fields("usage", query.group_by, row),
        }
    return {
        "object": "organization.costs.result",
        "amount": {"value": row.cost_usd, "currency": "usd"},
        **_group_fields("costs", query.group_by, row),
    }


def day_body(query: DayQuery, tenant_id: str | None, rows: Sequence[AggregateRow]) -> dict[str, Any]:
    return {
        "object": "usage.day",
        "tenant_id": tenant_id,
        "date": query.date,
        "input_tokens": sum(r.input_tokens for r in rows),
        "input_cached_tokens": sum(r.cached_tokens for r in rows),
        "output_tokens": sum(r.output_tokens for r in rows),
        "num_model_requests": sum(r.requests for r in rows),
        "cost_usd": sum(r.cost_usd for r in rows),
    }

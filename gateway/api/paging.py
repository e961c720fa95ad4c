"""The lists' doors (`GET /v1/files`, `GET /v1/batches`, a response's input items), read and
answered one way: the query's `limit`, `order` where the list has one, and `after` (the last id of
the previous page), each a 400 naming it when wrong; the page in OpenAI's list shape. What a page
holds is the list's own business."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from protocol import InvalidRequestError
from protocol.query import query_count

Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class PageQuery:
    limit: int
    order: Order
    after: str | None


def page_query(query: Mapping[str, str], *, max_limit: int, default_limit: int, ordered: bool) -> PageQuery:
    """`ordered`: the list takes `order` (newest first by default); a list without one ignores it,
    as it ignores any query parameter it does not name."""
    raw = query.get("limit")
    limit = default_limit if raw is None else query_count(raw)
    if limit is None or not 1 <= limit <= max_limit:
        raise InvalidRequestError(f"limit must be a whole number from 1 to {max_limit}.", param="limit")
    order = query.get("order", "desc") if ordered else "desc"
    if order != "asc" and order != "desc":
        raise InvalidRequestError("order must be 'asc' or 'desc'.", param="order")
    return PageQuery(limit, order, query.get("after") or None)


def cursor_page(objects: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """A page of a list, as OpenAI answers one: while `has_more`, the next is `after` its last id."""
    return {
        "object": "list",
        "data": objects,
        "first_id": objects[0]["id"] if objects else None,
        "last_id": objects[-1]["id"] if objects else None,
        "has_more": has_more,
    }


def page_of(oldest_first: list[dict[str, Any]], wanted: PageQuery) -> dict[str, Any]:
    """The page `wanted` of a list held in memory, oldest first; an `after` id not in it gives an
    empty page, as the stores' lists answer an unknown one."""
    items = oldest_first[::-1] if wanted.order == "desc" else oldest_first
    if wanted.after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(wanted.after) + 1 :] if wanted.after in ids else []
    return cursor_page(items[: wanted.limit], has_more=len(items) > wanted.limit)

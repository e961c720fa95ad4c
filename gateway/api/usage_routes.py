"""GET /v1/usage and GET /v1/costs: the usage ledger, shaped like OpenAI's organization usage and
costs APIs (gateway/ledger/query.py), plus the simple `GET /v1/usage?date=YYYY-MM-DD`.

A tenant's key sees only its own tenant (`?tenant=` may name it, or nothing: 403 for another).
An operator key (`ledger.operator_keys` in the gateway config) sees every tenant, or the one
`?tenant=` names. The quota window view is GET /v1/quota (quota_routes.py).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

from litestar import Controller, Request, get
from litestar.types import ASGIApp

from gateway.api.answer import Answer
from gateway.api.doors import CALL, Call, openai_errors
from gateway.call.context import CallContext
from gateway.call.pipeline import RequestPipeline
from gateway.ledger.build import Ledger
from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.query import (
    Kind,
    day_body,
    is_day_query,
    normalise,
    page_body,
    parse_buckets,
    parse_day,
)
from gateway.ledger.store.interface import AggregateQuery, AggregateRow
from protocol import PermissionDeniedError
from router.types import TenantPolicy


def _caller(
    pipeline: RequestPipeline, ledger: Ledger, ctx: CallContext, authorization: str | None
) -> TenantPolicy | None:
    """The caller's tenant, or None for an operator key (no tenant's). First: a request without a
    valid key is a 401 whatever its query says."""
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and ledger.is_operator(key.strip()):
        return None
    return pipeline.authenticate(ctx, authorization)


def _scope(caller: TenantPolicy | None, asked: str | None) -> str | None:
    """The tenant the caller may read (None: all tenants, operators only)."""
    if caller is None:
        return asked
    if asked is not None and asked != caller.tenant_id:
        raise PermissionDeniedError(
            "An API key can only read its own tenant's usage.", param="tenant", code="tenant_mismatch"
        )
    return caller.tenant_id


async def _aggregate(ledger: Ledger, query: AggregateQuery) -> list[AggregateRow]:
    # An operator may name any tenant (the document allows any string): one holding NUL names
    # none, and PostgreSQL's text cannot even be asked for it (that was a 503).
    if query.tenant_id is not None and "\x00" in query.tenant_id:
        return []
    return list(await ledger.store.aggregate(query))


async def _answer(
    kind: Kind,
    request: Request[Any, Any, Any],
    pipeline: RequestPipeline,
    ledger: Ledger | None,
    ctx: CallContext,
) -> ASGIApp:
    if ledger is None:
        raise LedgerUnavailable("The usage ledger is disabled on this gateway (ledger.enabled: false).")
    caller = _caller(pipeline, ledger, ctx, request.headers.get("authorization"))
    params = normalise(
        parse_qs(request.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    )
    if kind == "usage" and is_day_query(params):
        day = parse_day(params)
        tenant = _scope(caller, day.tenant)
        await ledger.catch_up()
        rows = await _aggregate(ledger, AggregateQuery("1d", day.start_ms, day.end_ms, tenant))
        body = day_body(day, tenant, rows)
    else:
        query = parse_buckets(kind, params, now_s=int(time.time()))
        tenant = _scope(caller, query.tenant)
        await ledger.catch_up()
        store_query, next_page = query.page(tenant)
        body = page_body(query, store_query, await _aggregate(ledger, store_query), next_page)
    return Answer.json(body, ctx.headers)


class UsageController(Controller):
    path = "/v1"
    dependencies = {"call": CALL}
    exception_handlers = {Exception: openai_errors}

    @get("/usage")
    async def usage(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, ledger: Ledger | None, call: Call
    ) -> ASGIApp:
        return await _answer("usage", request, pipeline, ledger, call)

    @get("/costs")
    async def costs(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, ledger: Ledger | None, call: Call
    ) -> ASGIApp:
        return await _answer("costs", request, pipeline, ledger, call)

"""GET /v1/quota: the caller's quota use in the current windows (a Meridian extension).

`?tenant=` is optional; when given it must be the caller's own tenant, so a key can never read
another tenant's quota (403 otherwise).
"""

from __future__ import annotations

from litestar import Controller, get
from litestar.params import Parameter
from litestar.types import ASGIApp

from gateway.api.answer import Answer
from gateway.api.doors import DEPENDENCIES, Call, Tenant, openai_errors
from gateway.call.pipeline import RequestPipeline
from protocol import PermissionDeniedError


class QuotaController(Controller):
    path = "/v1/quota"
    dependencies = DEPENDENCIES
    exception_handlers = {Exception: openai_errors}

    @get("/")
    async def quota(
        self,
        pipeline: RequestPipeline,
        call: Call,
        tenant: Tenant,
        tenant_id: str | None = Parameter(query="tenant", default=None),
    ) -> ASGIApp:
        if tenant_id is not None and tenant_id != tenant.tenant_id:
            raise PermissionDeniedError(
                "An API key can only read its own tenant's quota.", param="tenant", code="tenant_mismatch"
            )
        return Answer.json(await pipeline.usage(tenant), call.headers)

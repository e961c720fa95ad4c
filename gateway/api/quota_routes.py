"""GET /v1/quota: the caller's quota use in the current windows (a Meridian extension).

`?tenant=` is optional; when given it must be the caller's own tenant, so a key can never read
another tenant's quota (403 otherwise).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get

from gateway.api.errors import failed
from gateway.request.pipeline import RequestPipeline
from protocol import PermissionDeniedError


class QuotaController(Controller):
    path = "/v1/quota"

    @get("/")
    async def quota(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, tenant: str | None = None
    ) -> Response[dict[str, Any]]:
        ctx = pipeline.start_call(request.headers)
        try:
            caller = pipeline.authenticate(ctx, request.headers.get("authorization"))
            if tenant is not None and tenant != caller.tenant_id:
                raise PermissionDeniedError(
                    "An API key can only read its own tenant's quota.", param="tenant", code="tenant_mismatch"
                )
            usage = await pipeline.usage(caller)
        except Exception as exc:
            raise failed(pipeline, ctx, exc) from None
        return Response(usage, headers=ctx.headers)

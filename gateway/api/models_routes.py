"""`GET /v1/models` and `GET /v1/models/{model}`: the catalog models the caller's tenant may use.

Both SDKs call these paths, each expecting its own API's shapes. An Anthropic SDK always sends
`anthropic-version` (and its key as `x-api-key`): it gets Anthropic's model objects, its paging
(`limit` 1 to 1000, default 20, `after_id`, `before_id`) and its error format. Any other client
gets OpenAI's list, which has no paging. The key is taken from either header.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from litestar import Controller, Request, get
from litestar.types import ASGIApp

from gateway.api.answer import Answer
from gateway.api.doors import (
    ANTHROPIC_DEPENDENCIES,
    DEPENDENCIES,
    Call,
    Tenant,
    anthropic_client,
    client_errors,
)
from gateway.call.pipeline import RequestPipeline
from protocol import InvalidRequestError
from protocol.errors import NotFoundError
from protocol.objects import AnthropicModel, AnthropicModelList
from protocol.openai import ModelCard, ModelList
from protocol.query import query_count
from router.types import CatalogModel

# One fixed creation time for every model: the catalog has no history to tell.
_CREATED = int(time.time())
_CREATED_AT = datetime.fromtimestamp(_CREATED, UTC).isoformat().replace("+00:00", "Z")
_ANTHROPIC_PAGE = 20
_ANTHROPIC_MAX_PAGE = 1000


def _anthropic(model: CatalogModel) -> AnthropicModel:
    return AnthropicModel(id=model.name, display_name=model.name, created_at=_CREATED_AT)


def anthropic_page(models: list[CatalogModel], query: Any) -> AnthropicModelList:
    """Anthropic's paging over the catalog's order: `after_id` pages forward, `before_id` back; an
    id the list does not hold gives an empty page."""
    raw = query.get("limit")
    limit = _ANTHROPIC_PAGE if raw is None else query_count(raw)
    if limit is None or not 1 <= limit <= _ANTHROPIC_MAX_PAGE:
        raise InvalidRequestError(
            f"limit must be a whole number from 1 to {_ANTHROPIC_MAX_PAGE}.", param="limit"
        )
    names = [model.name for model in models]
    after, before = query.get("after_id"), query.get("before_id")
    if after is not None and before is not None:
        raise InvalidRequestError("Send at most one of after_id and before_id.", param="before_id")
    if after is not None:
        start = names.index(after) + 1 if after in names else len(names)
        page, more = models[start : start + limit], start + limit < len(models)
    elif before is not None:
        end = names.index(before) if before in names else 0
        page, more = models[max(0, end - limit) : end], end - limit > 0
    else:
        page, more = models[:limit], limit < len(models)
    return AnthropicModelList(
        data=[_anthropic(model) for model in page],
        has_more=more,
        first_id=page[0].name if page else None,
        last_id=page[-1].name if page else None,
    )


class ModelsController(Controller):
    path = "/v1"
    dependencies = {**DEPENDENCIES, **ANTHROPIC_DEPENDENCIES}
    exception_handlers = {Exception: client_errors}

    @get("/models")
    async def models(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, call: Call, tenant: Tenant
    ) -> ASGIApp:
        allowed = pipeline.allowed_models(tenant)
        if anthropic_client(request):
            return Answer.json(anthropic_page(allowed, request.query_params), call.headers)
        cards = [ModelCard(id=model.name, created=_CREATED) for model in allowed]
        return Answer.json(ModelList(data=cards), call.headers)

    # `path`, not `str`: catalog names may hold a slash ("org/model"), which the SDKs send as is.
    @get("/models/{model:path}")
    async def model(
        self,
        request: Request[Any, Any, Any],
        model: str,
        pipeline: RequestPipeline,
        call: Call,
        tenant: Tenant,
    ) -> ASGIApp:
        name = model.removeprefix("/")
        found = next((m for m in pipeline.allowed_models(tenant) if m.name == name), None)
        if found is None:
            # A model the tenant may not use is not found either, as the list does not show it.
            raise NotFoundError(
                f"The model {name!r} does not exist or this key may not use it.", param="model"
            )
        if anthropic_client(request):
            return Answer.json(_anthropic(found), call.headers)
        return Answer.json(ModelCard(id=name, created=_CREATED), call.headers)

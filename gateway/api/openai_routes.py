"""OpenAI-compatible front door: /v1/chat/completions, /v1/completions, /v1/models (list and
retrieve); /v1/usage and /v1/costs are in usage_routes.py, /v1/quota in quota_routes.py.

Thin on purpose: the call and its tenant are dependencies (doors.py), so a handler parses the
body, hands it to the RequestPipeline, and shapes the response; errors are the door's handler's.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Controller, Request, get, post
from litestar.types import ASGIApp

from gateway.api.answer import Answer
from gateway.api.body import request_body
from gateway.api.doors import DEPENDENCIES, Call, Tenant, openai_errors
from gateway.api.sse import SSEResponse
from gateway.call.pipeline import RequestPipeline
from gateway.upstreams.base import Endpoint
from protocol import ChatCompletionRequest, CompletionRequest
from protocol.errors import NotFoundError
from protocol.openai import ModelCard, ModelList, decode_request_and_object

_REQUEST_TYPES: dict[Endpoint, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
}
# /v1/models reports one fixed creation time: the catalog has no history to tell.
_CREATED = int(time.time())


async def _serve(
    pipeline: RequestPipeline, call: Call, request: Request[Any, Any, Any], endpoint: Endpoint
) -> ASGIApp:
    parsed, body = decode_request_and_object(await request_body(request), _REQUEST_TYPES[endpoint])
    if parsed.stream:
        return SSEResponse(await pipeline.stream(call, endpoint, parsed, body))
    return Answer.json(await pipeline.complete(call, endpoint, parsed, body), call.headers)


class OpenAIController(Controller):
    path = "/v1"
    dependencies = DEPENDENCIES
    exception_handlers = {Exception: openai_errors}

    @post("/chat/completions", status_code=200)
    async def chat_completions(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, call: Call, tenant: Tenant
    ) -> ASGIApp:
        return await _serve(pipeline, call, request, "chat")

    @post("/completions", status_code=200)
    async def completions(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, call: Call, tenant: Tenant
    ) -> ASGIApp:
        return await _serve(pipeline, call, request, "completions")

    @get("/models")
    async def models(self, pipeline: RequestPipeline, call: Call, tenant: Tenant) -> ASGIApp:
        cards = [ModelCard(id=m.name, created=_CREATED) for m in pipeline.allowed_models(tenant)]
        return Answer.json(ModelList(data=cards), call.headers)

    # `path`, not `str`: catalog names may hold a slash ("org/model"), which the SDKs send as is.
    @get("/models/{model:path}")
    async def model(self, model: str, pipeline: RequestPipeline, call: Call, tenant: Tenant) -> ASGIApp:
        name = model.removeprefix("/")
        if not any(m.name == name for m in pipeline.allowed_models(tenant)):
            # A model the tenant may not use is not found either, as the list does not show it.
            raise NotFoundError(
                f"The model {name!r} does not exist or this key may not use it.", param="model"
            )
        return Answer.json(ModelCard(id=name, created=_CREATED), call.headers)

"""OpenAI-compatible front door: /v1/chat/completions, /v1/completions, /v1/models (/v1/usage and
/v1/costs are in usage_routes.py, /v1/quota in quota_routes.py).

Thin on purpose: parse the body, hand it to the RequestPipeline, shape the response.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Controller, Request, Response, get, post

from gateway.api.body import request_body
from gateway.api.errors import failed
from gateway.api.sse import SSEResponse
from gateway.request.context import CallContext
from gateway.request.pipeline import RequestPipeline
from gateway.upstreams.base import Endpoint
from protocol import ChatCompletionRequest, CompletionRequest
from protocol.openai import ModelCard, ModelList, decode_request_and_object

_REQUEST_TYPES: dict[Endpoint, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
}
# /v1/models reports one fixed creation time: the catalog has no history to tell.
_CREATED = int(time.time())


async def _serve(
    pipeline: RequestPipeline, request: Request[Any, Any, Any], endpoint: Endpoint
) -> Response[Any]:
    ctx: CallContext = pipeline.start_call(request.headers)
    try:
        pipeline.authenticate(ctx, request.headers.get("authorization"))
        raw = await request_body(request)
        parsed, body = decode_request_and_object(raw, _REQUEST_TYPES[endpoint])
        if parsed.stream:
            stream = await pipeline.stream(ctx, endpoint, parsed, body)
            return SSEResponse(stream)
        result = await pipeline.complete(ctx, endpoint, parsed, body)
    except Exception as exc:
        raise failed(pipeline, ctx, exc) from None
    pipeline.record(ctx, "200", stream=False)
    return Response(result, headers=ctx.headers, status_code=200)


class OpenAIController(Controller):
    path = "/v1"

    @post("/chat/completions", status_code=200)
    async def chat_completions(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline
    ) -> Response[Any]:
        return await _serve(pipeline, request, "chat")

    @post("/completions", status_code=200)
    async def completions(self, request: Request[Any, Any, Any], pipeline: RequestPipeline) -> Response[Any]:
        return await _serve(pipeline, request, "completions")

    @get("/models")
    async def models(self, request: Request[Any, Any, Any], pipeline: RequestPipeline) -> Response[ModelList]:
        ctx = pipeline.start_call(request.headers)
        try:
            tenant = pipeline.authenticate(ctx, request.headers.get("authorization"))
        except Exception as exc:
            raise failed(pipeline, ctx, exc) from None
        cards = [ModelCard(id=m.name, created=_CREATED) for m in pipeline.allowed_models(tenant)]
        return Response(ModelList(data=cards), headers=ctx.headers)

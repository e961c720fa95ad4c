"""OpenAI-compatible front door: /v1/chat/completions and /v1/completions; /v1/models is in
models_routes.py (both SDKs call it), /v1/usage and /v1/costs in usage_routes.py, /v1/quota in
quota_routes.py.

Thin on purpose: the call and its tenant are dependencies (doors.py), so a handler parses the
body, hands it to the RequestPipeline, and shapes the response; errors are the door's handler's.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.types import ASGIApp

from gateway.api.answer import Answer
from gateway.api.body import request_body
from gateway.api.doors import DEPENDENCIES, Call, Tenant, openai_errors
from gateway.api.sse import SSEResponse
from gateway.call.pipeline import RequestPipeline
from gateway.upstreams.base import Endpoint
from protocol import ChatCompletionRequest, CompletionRequest
from protocol.openai import decode_request_and_object

_REQUEST_TYPES: dict[Endpoint, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
}


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

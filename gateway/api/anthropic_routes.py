"""Anthropic-compatible front door: `POST /v1/messages`, so Anthropic SDK users can call Meridian.

Thin like the OpenAI door: translate the Messages request into an OpenAI chat request, run it
through the same RequestPipeline (auth, policy, quota, routing to nodes or providers), and
translate the answer back, streamed as Anthropic's event sequence. Every error, including a
stream that breaks midway, is in Anthropic's `{"type": "error", "error": {type, message}}` shape.
The key comes as `x-api-key` (Anthropic's SDKs) or `Authorization: Bearer` (everyone else).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import msgspec
from litestar import Controller, Request, Response, post

from gateway.api.body import request_body
from gateway.api.errors import failed
from gateway.api.sse import SSEResponse
from gateway.request.context import CallContext
from gateway.request.pipeline import RequestPipeline
from gateway.streaming.served import ServedStream
from gateway.upstreams.providers.anthropic_errors import anthropic_error_body, error_type_for_status
from gateway.upstreams.providers.anthropic_stream import ChatToMessagesStream, Event
from gateway.upstreams.providers.anthropic_translate import (
    TranslationError,
    chat_response_to_message,
    messages_request_to_chat,
)
from protocol import APIError, AuthenticationError, ChatCompletionRequest, InvalidRequestError
from protocol.anthropic import MessagesRequest
from protocol.openai import decode_request
from protocol.sse import encode_event


def _authorization(headers: Mapping[str, str]) -> str | None:
    api_key = headers.get("x-api-key")
    return f"Bearer {api_key}" if api_key else headers.get("authorization")


def _error_response(error: APIError) -> Response[Any]:
    message = error.message
    if isinstance(error, AuthenticationError):
        message = "Incorrect or missing API key. Send it as 'x-api-key: KEY' or 'Authorization: Bearer KEY'."
    body = anthropic_error_body(error_type_for_status(error.status_code), message)
    return Response(body, status_code=error.status_code, headers=error.headers)


def _event(event: Event) -> bytes:
    return encode_event(*event)


def message_id(ctx: CallContext) -> str:
    return "msg_" + ctx.request_id.removeprefix("req_")


async def _frames(stream: ServedStream, events: ChatToMessagesStream) -> AsyncGenerator[bytes, None]:
    for event in events.start():
        yield _event(event)
    async for chunk in stream.chunks:
        if isinstance(chunk.get("error"), dict):
            # The pipeline's last word on a stream it could not finish or continue.
            message = str(chunk["error"].get("message") or "The stream was interrupted.")
            blocked = chunk["error"].get("code") == "content_policy_violation"
            yield _event(events.error("invalid_request_error" if blocked else "api_error", message))
            return
        for event in events.feed(chunk):
            yield _event(event)
    for event in events.finish():
        yield _event(event)


def _chat_request(raw: bytes) -> tuple[MessagesRequest, dict[str, Any], ChatCompletionRequest]:
    """The Messages request, its OpenAI chat body and that body's struct; 400s name the field."""
    request = decode_request(raw, MessagesRequest)
    try:
        body = messages_request_to_chat(request)
    except TranslationError as exc:
        raise InvalidRequestError(exc.message, param=exc.param) from None
    return request, body, msgspec.convert(body, ChatCompletionRequest)


class AnthropicController(Controller):
    path = "/v1"

    @post("/messages", status_code=200)
    async def messages(self, request: Request[Any, Any, Any], pipeline: RequestPipeline) -> Response[Any]:
        ctx = pipeline.start_call(request.headers)
        try:
            pipeline.authenticate(ctx, _authorization(request.headers))
            messages, body, parsed = _chat_request(await request_body(request))
            if parsed.stream:
                stream = await pipeline.stream(ctx, "chat", parsed, body)
                events = ChatToMessagesStream(
                    message_id=message_id(ctx), model=ctx.model, stop_sequences=messages.stop_sequences
                )
                return SSEResponse(stream, frames=_frames(stream, events))
            result = await pipeline.complete(ctx, "chat", parsed, body)
        except Exception as exc:
            return _error_response(failed(pipeline, ctx, exc))
        pipeline.record(ctx, "200", stream=False)
        message = chat_response_to_message(result, stop_sequences=messages.stop_sequences)
        message["id"] = message_id(ctx)
        return Response(message, headers=ctx.headers, status_code=200)

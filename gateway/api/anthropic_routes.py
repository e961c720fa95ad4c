"""Anthropic-compatible front door: `POST /v1/messages`, so Anthropic SDK users can call Meridian.

Thin like the OpenAI door: translate the Messages request into an OpenAI chat request, run it
through the same RequestPipeline (auth, policy, quota, routing to nodes or providers), and
translate the answer back, streamed as Anthropic's event sequence. Every error, including a
stream that breaks midway, is in Anthropic's `{"type": "error", "error": {type, message}}` shape
(doors.py). The key comes as `x-api-key` (Anthropic's SDKs) or `Authorization: Bearer`.
`POST /v1/messages/count_tokens` translates the same way and asks the pipeline's `count_tokens`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from litestar import Controller, Request, post
from litestar.types import ASGIApp

from gateway.api.answer import Answer
from gateway.api.body import request_body
from gateway.api.doors import ANTHROPIC_DEPENDENCIES, DEPENDENCIES, Call, Tenant, anthropic_errors
from gateway.api.sse import SSEResponse
from gateway.call.context import CallContext
from gateway.call.pipeline import RequestPipeline
from gateway.call.served import ServedStream
from gateway.translate.anthropic_to_openai import messages_request_to_chat
from gateway.translate.chat_request import ChatRequest
from gateway.translate.errors import TranslationError
from gateway.translate.openai_to_anthropic_answers import (
    ChatToMessagesStream,
    Event,
    chat_response_to_message,
)
from protocol import InvalidRequestError
from protocol.anthropic import MessagesCountRequest, MessagesRequest
from protocol.chunk import StreamFailed, to_builtins
from protocol.objects import MessageTokensCount
from protocol.openai import decode_request
from protocol.sse import encode_event


def _event(event: Event) -> bytes:
    return encode_event(*event)


def message_id(ctx: CallContext) -> str:
    return "msg_" + ctx.request_id.removeprefix("req_")


async def _frames(stream: ServedStream, events: ChatToMessagesStream) -> AsyncGenerator[bytes, None]:
    served = stream.ctx.served
    for event in events.start(served.opened_usage if served is not None else None):
        yield _event(event)
    async for item in stream.items():
        if isinstance(item, StreamFailed):
            # The pipeline's last word on a stream it could not finish or continue: the open
            # block is closed, and the error says why.
            blocked = item.code == "content_policy_violation"
            for event in events.failed("invalid_request_error" if blocked else "api_error", item.message):
                yield _event(event)
            return
        for event in events.feed(item):
            yield _event(event)
    for event in events.finish():
        yield _event(event)


def _chat_request(request: MessagesRequest) -> ChatRequest:
    """The Messages request as a chat request; 400s name the field."""
    try:
        return messages_request_to_chat(request)
    except TranslationError as exc:
        raise InvalidRequestError(exc.message, param=exc.param) from None


class AnthropicController(Controller):
    path = "/v1"
    dependencies = {**DEPENDENCIES, **ANTHROPIC_DEPENDENCIES}
    exception_handlers = {Exception: anthropic_errors}

    @post("/messages", status_code=200)
    async def messages(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, call: Call, tenant: Tenant
    ) -> ASGIApp:
        messages = decode_request(await request_body(request), MessagesRequest)
        chat = _chat_request(messages)
        if chat.parsed.stream:
            with chat.errors_in_request_terms():
                stream = await pipeline.stream(call, "chat", chat.parsed, chat.body)
            events = ChatToMessagesStream(
                message_id=message_id(call), model=call.model, stop_sequences=messages.stop_sequences
            )
            return SSEResponse(stream, frames=_frames(stream, events))
        with chat.errors_in_request_terms():
            result = await pipeline.complete(call, "chat", chat.parsed, chat.body)
        message = chat_response_to_message(to_builtins(result), stop_sequences=messages.stop_sequences)
        message["id"] = message_id(call)
        return Answer.json(message, call.headers)

    @post("/messages/count_tokens", status_code=200)
    async def count_tokens(
        self, request: Request[Any, Any, Any], pipeline: RequestPipeline, call: Call, tenant: Tenant
    ) -> ASGIApp:
        """Anthropic's token count: the input tokens of the conversation as the model that would
        serve it reads them (its chat template included), counted by that model's upstream."""
        counted = decode_request(await request_body(request), MessagesCountRequest)
        chat = _chat_request(counted.as_messages_request())
        chat.body.pop("max_tokens")
        chat.parsed.max_tokens = None
        with chat.errors_in_request_terms():
            count = await pipeline.count_tokens(call, chat.parsed, chat.body)
        return Answer.json(MessageTokensCount(input_tokens=count), call.headers)

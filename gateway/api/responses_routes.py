"""Responses API front door (text and function tools): `POST /v1/responses`,
`GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel`,
`DELETE /v1/responses/{id}`, and `POST /v1/responses/input_tokens` (a request's input tokens,
counted as the pipeline's `count_tokens` counts them).

Like /v1/messages, a request is translated to a chat request and served by the same pipeline
(policy, residency, quotas, usage, routing). Every response, foreground or background, is a run
the ResponseStore owns and drives in its own task, reading the pipeline's stream: so a cancel by
id, from any connection, cancels that task, which closes the node stream (the node aborts the
request and frees its KV blocks). A foreground request waits for its run (or streams its
events) and cancels it if the client goes away; a background one returns at once.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from typing import Any

from litestar import Controller, Request, delete, get, post
from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.api.answer import Answer
from gateway.api.body import request_body
from gateway.api.doors import DEPENDENCIES, Call, Tenant, every_method_in_allow, openai_errors
from gateway.api.paging import page_of, page_query
from gateway.call.pipeline import RequestPipeline
from gateway.responses import Run, parse_request
from gateway.responses.items import InputItem
from gateway.responses.store import ResponseStore
from gateway.responses.translate import ResponsesRequest, chat_request
from gateway.runtime.tasks import run_shielded
from gateway.translate.chat_request import ChatRequest
from http_server import EventStream
from protocol import InvalidRequestError
from protocol.errors import ConflictError, NotFoundError
from protocol.objects import InputTokenCount
from protocol.sse import encode_event


class _EventStream(EventStream):
    """The run's events, then the run cancelled if it is still going (the client left
    mid-stream: its foreground run has no one to answer)."""

    __slots__ = ("_run", "_store")

    def __init__(self, store: ResponseStore, run: Run, headers: dict[str, str]) -> None:
        self._store = store
        self._run = run
        super().__init__(_frames(run), headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _abandon(self._store, self._run)


async def _abandon(store: ResponseStore, run: Run) -> None:
    """A foreground run whose request ended before it did: nobody else will read it, so it stops."""
    if not run.finished:
        await run_shielded(lambda: store.cancel(run), what="cancel an abandoned response")


async def _frames(run: Run) -> AsyncGenerator[bytes, None]:
    assert run.events is not None
    async for name, payload in run.events:
        yield encode_event(name, payload)


def _owned(store: ResponseStore, response_id: str, tenant_id: str) -> Run:
    run = store.get(response_id, tenant_id)
    if run is None:
        raise NotFoundError(
            f"No response found with id '{response_id}'.", param="response_id", code="not_found"
        )
    return run


def _earlier(store: ResponseStore, wanted: ResponsesRequest, tenant_id: str) -> tuple[InputItem, ...]:
    """The conversation `previous_response_id` continues: a finished response of the tenant's
    (unknown, expired, unstored or another tenant's: 404, as OpenAI's `previous_response_not_found`;
    one still running: 409, its conversation is not whole yet)."""
    previous_id = wanted.previous_response_id
    if previous_id is None:
        return ()
    previous = store.get(previous_id, tenant_id)
    if previous is None:
        raise NotFoundError(
            f"Previous response with id '{previous_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if not previous.finished:
        raise ConflictError(
            f"Previous response '{previous_id}' is still {previous.status}: continue it once it ended.",
            param="previous_response_id",
            code="previous_response_in_progress",
        )
    return previous.conversation()


def _translated(
    store: ResponseStore, raw: bytes, tenant_id: str
) -> tuple[ResponsesRequest, tuple[InputItem, ...], ChatRequest]:
    wanted = parse_request(raw)
    earlier = _earlier(store, wanted, tenant_id)
    return wanted, earlier, chat_request(wanted, earlier)


class ResponsesController(Controller):
    path = "/v1/responses"
    dependencies = DEPENDENCIES
    exception_handlers = {Exception: openai_errors}
    before_request = every_method_in_allow

    @post("/", status_code=200)
    async def create(
        self,
        request: Request[Any, Any, Any],
        call: Call,
        tenant: Tenant,
        responses: ResponseStore,
    ) -> ASGIApp:
        ctx = call
        wanted, earlier, chat = _translated(responses, await request_body(request), tenant.tenant_id)
        response_id = "resp_" + os.urandom(16).hex()
        ctx.headers["x-meridian-response-id"] = response_id
        run = Run(response_id, tenant.tenant_id, wanted, stream=wanted.stream, earlier=earlier)
        responses.start(run, ctx, chat)
        if wanted.background:
            return Answer.json(run.to_object(), ctx.headers)
        try:
            # Errors before the first token are HTTP errors, as for chat: the run's failed open
            # raises the APIError (with this call's headers) here.
            await run.opened
            if run.events is None:
                await run.done.wait()
        except BaseException:
            await _abandon(responses, run)  # its client left, or the run failed to open
            raise
        if run.events is not None:
            return _EventStream(responses, run, ctx.headers)
        return Answer.json(run.to_object(), ctx.headers)

    @post("/input_tokens", status_code=200)
    async def input_tokens(
        self,
        request: Request[Any, Any, Any],
        call: Call,
        tenant: Tenant,
        pipeline: RequestPipeline,
        responses: ResponseStore,
    ) -> ASGIApp:
        """OpenAI's input token count of a Responses request (`responses.input_tokens.count`):
        its conversation (`previous_response_id`'s too), instructions and tools as the model that
        would serve them reads them."""
        _, _, chat = _translated(responses, await request_body(request), tenant.tenant_id)
        with chat.errors_in_request_terms():
            count = await pipeline.count_tokens(call, chat.parsed, chat.body)
        return Answer.json(InputTokenCount(input_tokens=count), call.headers)

    @get("/{response_id:str}")
    async def retrieve(
        self,
        request: Request[Any, Any, Any],
        response_id: str,
        call: Call,
        tenant: Tenant,
        responses: ResponseStore,
    ) -> ASGIApp:
        run = _owned(responses, response_id, tenant.tenant_id)
        if request.query_params.get("stream") in ("true", "1"):
            raise InvalidRequestError("Streaming a stored response is not supported.", param="stream")
        return Answer.json(run.to_object(), call.headers)

    @get("/{response_id:str}/input_items")
    async def input_items(
        self,
        request: Request[Any, Any, Any],
        response_id: str,
        call: Call,
        tenant: Tenant,
        responses: ResponseStore,
    ) -> ASGIApp:
        items = _owned(responses, response_id, tenant.tenant_id).input_items()
        wanted = page_query(request.query_params, max_limit=100, default_limit=20, ordered=True)
        return Answer.json(page_of(items, wanted), call.headers)

    @post("/{response_id:str}/cancel", status_code=200)
    async def cancel(self, response_id: str, call: Call, tenant: Tenant, responses: ResponseStore) -> ASGIApp:
        run = _owned(responses, response_id, tenant.tenant_id)
        if run.finished and run.status != "cancelled":
            raise ConflictError(
                f"Response '{response_id}' is already {run.status}: only a running response can be cancelled.",
                param="response_id",
                code="response_not_cancellable",
            )
        await responses.cancel(run)
        return Answer.json(run.to_object(), call.headers)

    @delete("/{response_id:str}", status_code=200)
    async def remove(self, response_id: str, call: Call, tenant: Tenant, responses: ResponseStore) -> ASGIApp:
        await responses.delete(_owned(responses, response_id, tenant.tenant_id))
        return Answer.json({"id": response_id, "object": "response", "deleted": True}, call.headers)

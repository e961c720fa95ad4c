"""How every front door is declared, once: the call and its tenant as dependencies, and one
exception handler per wire format.

A handler is parse → pipeline → encode. It names what it needs:

- `call`: the CallContext, started for this request (and remembered on the request, so the
  exception handler can finish it);
- `tenant`: the caller's tenant, authenticated from `Authorization: Bearer` (the Anthropic door
  also takes `x-api-key`); an unknown key raises, and the handler never runs.

Whatever a handler or a dependency raises reaches its door's exception handler, which maps it to
the door's own error format once (errors.py), tells the call's observers how it ended, and puts
the call's headers on the answer. Requests rejected before any door is reached (404, 405) are
answered by the app's handler, in the format of the door whose path they named.

A client that leaves before its answer is complete is no exception: the server cancels the
request's task (http_server's `cancel_on_disconnect`), every stage's clean-up runs as the
cancellation unwinds it (the upstream closed, the quota settled, the usage recorded), and
`ClientDepartures`, the app's outermost layer, records its call as 499 (the status nginx gave a
client that closed its request) unless its stream's close recorded it; the server then ends the
request quietly.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from litestar import Litestar, Request, Response
from litestar.di import Provide
from litestar.exceptions import NotFoundException
from litestar.params import Dependency
from litestar.routes import HTTPRoute

from gateway.call.context import CallContext
from gateway.call.pipeline import RequestPipeline
from gateway.errors import to_api_error
from gateway.upstreams.providers.anthropic_errors import anthropic_error
from http_server import client_left
from protocol import APIError, AuthenticationError
from protocol.errors import invalid_url
from router.types import TenantPolicy

logger = logging.getLogger(__name__)

_CALL = "meridian.call"

# Handlers name them with these types: the values are ours, so Litestar is told not to convert them.
Call = Annotated[CallContext, Dependency(skip_validation=True)]
Tenant = Annotated[TenantPolicy, Dependency(skip_validation=True)]


async def _start_call(request: Request[Any, Any, Any], pipeline: RequestPipeline) -> CallContext:
    ctx = pipeline.start_call(request.headers)
    request.scope[_CALL] = ctx  # type: ignore[literal-required]
    return ctx


async def _bearer_tenant(
    request: Request[Any, Any, Any], pipeline: RequestPipeline, call: Call
) -> TenantPolicy:
    return pipeline.authenticate(call, request.headers.get("authorization"))


async def _anthropic_tenant(
    request: Request[Any, Any, Any], pipeline: RequestPipeline, call: Call
) -> TenantPolicy:
    api_key = request.headers.get("x-api-key")
    authorization = request.headers.get("authorization")
    if (
        api_key is not None
        and authorization is not None
        and authorization.partition(" ")[2].strip() != api_key.strip()
    ):
        # Two keys that differ: neither is taken over the other (an invalid one is never ignored).
        authorization = None
    elif api_key:
        authorization = f"Bearer {api_key}"
    return pipeline.authenticate(call, authorization)


async def every_method_in_allow(request: Request[Any, Any, Any]) -> Response[None] | None:
    """A `before_request` hook for the doors with paths served by several handlers (GET and
    DELETE of a file, say): answers OPTIONS with every method of the path. Litestar 2's own
    answer lists only the first handler's (litestar#4169, fixed in Litestar 3); 405s list them
    all already (errors.py)."""
    if request.method != "OPTIONS":
        return None
    template = request.scope.get("path_template")
    methods = {
        m
        for r in request.app.routes
        if isinstance(r, HTTPRoute) and r.path_format == template
        for m in r.methods
    }
    return Response(None, status_code=204, headers={"allow": ", ".join(sorted(methods))})


CALL = Provide(_start_call)
# Every door's dependencies; the Anthropic door replaces `tenant` with its own.
DEPENDENCIES = {"call": CALL, "tenant": Provide(_bearer_tenant)}
ANTHROPIC_DEPENDENCIES = {"tenant": Provide(_anthropic_tenant)}


def _finished(request: Request[Any, Any, Any], exc: Exception) -> APIError:
    """The APIError for `exc`; the call (if one started) is recorded under its status and its
    headers join the error's."""
    ctx: CallContext | None = request.scope.get(_CALL)  # type: ignore[assignment]
    if isinstance(exc, NotFoundException):  # the router's miss (our own 404s are NotFoundError)
        error = invalid_url(request.method, request.url.path, "gateway")
    else:
        error = to_api_error(exc, request_id=ctx.request_id if ctx is not None else "-")
    if ctx is not None:
        pipeline: RequestPipeline = request.app.state["gateway"].pipeline
        pipeline.record(ctx, str(error.status_code), stream=False)  # adds Server-Timing to the headers
        error.headers = {**ctx.headers, **error.headers}
    return error


def openai_errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    error = _finished(request, exc)
    return Response(error.to_body(), status_code=error.status_code, headers=error.headers)


def anthropic_errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Anthropic's `{"type": "error", "error": {type, message}}`, for every error of /v1/messages."""
    error = _finished(request, exc)
    if isinstance(error, AuthenticationError):
        error.message = (
            "Incorrect or missing API key. Send it as 'x-api-key: KEY' or 'Authorization: Bearer KEY' "
            "(the same key, if both)."
        )
    return Response(anthropic_error(error), status_code=error.status_code, headers=error.headers)


def anthropic_client(request: Request[Any, Any, Any]) -> bool:
    """Whether an Anthropic SDK sent the request: they all send `anthropic-version`, OpenAI's never
    do. The doors both SDKs call (`/v1/models`) answer each in its own shapes."""
    return "anthropic-version" in request.headers


def client_errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """For the doors both SDKs call: Anthropic's error format to an Anthropic client, else OpenAI's."""
    return anthropic_errors(request, exc) if anthropic_client(request) else openai_errors(request, exc)


def any_door_errors(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The app's handler: errors raised before a door's own handler could (no route, wrong
    method) in the format of the door the path names."""
    path = request.scope.get("path", "")
    if path.startswith("/v1/messages"):
        return anthropic_errors(request, exc)
    if path.startswith("/v1/models"):
        return client_errors(request, exc)
    return openai_errors(request, exc)


class ClientDepartures:
    """The public app as the server runs it: a request whose client left (its task cancelled by
    the server, which says so in the scope) has its call recorded as 499 here; the server then
    ends it quietly."""

    def __init__(self, app: Litestar) -> None:
        self.app = app
        self._pipeline: RequestPipeline = app.state["gateway"].pipeline

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            ctx: CallContext | None = scope.get(_CALL)
            if client_left(scope) and ctx is not None and not ctx.recorded:
                logger.info("request %s: the client left before its answer was complete", ctx.request_id)
                self._pipeline.record(ctx, "499", stream=False)
            raise

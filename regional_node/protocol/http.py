"""The HTTP edge of the protocol: error responses and SSE framing, shared by node and gateway.

Every exception that reaches a Litestar app becomes an OpenAI-format body here, so no handler
ever leaks a stack trace.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException

from regional_node.protocol.errors import APIError, InternalServerError, InvalidRequestError, NotFoundError

logger = logging.getLogger(__name__)

SSE_DONE = b"data: [DONE]\n\n"
_encoder = msgspec.json.Encoder()


def sse_event(payload: Any) -> bytes:
    """One Server-Sent Events `data:` frame holding `payload` as JSON."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def error_response(error: APIError) -> Response[Any]:
    return Response(content=error.to_body(), status_code=error.status_code, headers=error.headers)


def _to_api_error(exc: Exception) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, NotFoundException):
        return NotFoundError(str(exc.detail or "Not found"), code="not_found")
    if isinstance(exc, ValidationException):
        return InvalidRequestError(str(exc.detail or "Invalid request"))
    if isinstance(exc, HTTPException):
        error = APIError(str(exc.detail or "HTTP error"), code=None)
        error.status_code = exc.status_code
        error.error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error
    logger.exception("unhandled error while serving a request", exc_info=exc)
    return InternalServerError("The server had an error while processing your request.")


def handle_exception(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar exception handler: register as `exception_handlers={Exception: handle_exception}`."""
    return error_response(_to_api_error(exc))

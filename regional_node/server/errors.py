"""The one place where engine exceptions become OpenAI-format API errors.

The engine has its own hierarchy (regional_node.engine.errors) so it never depends on HTTP; the
node's handlers call `api_error` on anything the engine raises and let the protocol's exception
handler render the body.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException

from protocol import (
    APIError,
    ContextLengthError,
    InternalServerError,
    InvalidRequestError,
    ServiceUnavailableError,
)
from protocol.errors import OverloadedError, error_for_status, invalid_url
from regional_node.engine.errors import (
    ContextLengthExceededError,
    EngineError,
    QueueFullError,
    RequestTooLargeError,
)
from regional_node.engine.errors import InvalidRequestError as EngineInvalidRequestError

logger = logging.getLogger(__name__)


def api_error(exc: BaseException, *, prompt_param: str) -> APIError:
    """Map an engine (or already-API) exception to the error the client sees.

    `prompt_param` is the request field that holds the prompt ("messages" for chat, "prompt" for
    completions): the engine only knows it as "prompt".
    """
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthExceededError):
        return ContextLengthError(exc.message, param=_param(exc.param or "prompt", prompt_param))
    if isinstance(exc, EngineInvalidRequestError):
        return InvalidRequestError(exc.message, param=_param(exc.param, prompt_param))
    if isinstance(exc, RequestTooLargeError):
        return InvalidRequestError(str(exc), param=prompt_param, code="request_too_large")
    if isinstance(exc, QueueFullError):
        return OverloadedError(str(exc), headers={"retry-after": str(exc.retry_after_s)})
    if isinstance(exc, EngineError):
        logger.error("engine error while serving a request: %s", exc)
        return InternalServerError(f"The engine failed to serve the request: {exc}")
    logger.error("unexpected error while serving a request", exc_info=exc)
    return InternalServerError("The server had an error while processing your request.")


def aborted_error() -> APIError:
    """The engine aborted the request (shutdown, or a failure that was not the client's)."""
    return ServiceUnavailableError(
        "The request was aborted by the node before it finished; retry it.", code="request_aborted"
    )


def _param(engine_param: str | None, prompt_param: str) -> str | None:
    return prompt_param if engine_param == "prompt" else engine_param


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The node app's exception handler: every exception becomes an OpenAI-format body, so no
    handler ever leaks a stack trace."""
    if isinstance(exc, APIError):
        error = exc
    elif isinstance(exc, ValidationException):
        error = InvalidRequestError(str(exc.detail or "Invalid request"))
    elif isinstance(exc, NotFoundException):  # the router's miss
        error = invalid_url(request.method, request.url.path, "node")
    elif isinstance(exc, HTTPException):
        error = error_for_status(exc.status_code, str(exc.detail or "HTTP error"))
    else:
        logger.exception("unhandled error while serving a request", exc_info=exc)
        error = InternalServerError("The server had an error while processing your request.")
    return Response(content=error.to_body(), status_code=error.status_code, headers=error.headers)

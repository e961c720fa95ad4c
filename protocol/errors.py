"""OpenAI-format API errors: one hierarchy, rendered to `{"error": {...}}` in one place."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error the client should see, with OpenAI's status code, type and code."""

    status_code: int = 500
    error_type: str = "server_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = dict(headers or {})

    def to_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(APIError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthError(InvalidRequestError):
    default_code = "context_length_exceeded"


class AuthenticationError(APIError):
    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(APIError):
    status_code = 403
    error_type = "permission_error"
    default_code = "model_not_allowed"


class NotFoundError(APIError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"


class ConflictError(APIError):
    """The object is not in a state that allows the request (cancelling what already ended): the
    request itself is valid, so not a 400; a client re-reads the object rather than fix the call."""

    status_code = 409
    error_type = "invalid_request_error"


class RequestTimeoutError(APIError):
    """The client did not send its request (headers or body) within the server's read timeout."""

    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class PayloadTooLargeError(APIError):
    """The request body is over the server's size limit (refused before it is read whole)."""

    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class UnsupportedMediaTypeError(APIError):
    """The request body is in a content coding the server does not decode; `Accept-Encoding`
    (pass it in `headers`) names those it does (RFC 9110, 15.5.16)."""

    status_code = 415
    error_type = "invalid_request_error"
    default_code = "unsupported_content_encoding"


class ClientClosedRequestError(APIError):
    """The client left before sending its whole request: 499 (nginx's "client closed request")
    is what logs and metrics count it as; nobody reads the body."""

    status_code = 499
    error_type = "invalid_request_error"
    default_code = "client_closed_request"


class RateLimitError(APIError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class InternalServerError(APIError):
    status_code = 500
    error_type = "server_error"
    default_code = "internal_error"


class ServiceUnavailableError(APIError):
    status_code = 503
    error_type = "server_error"
    default_code = "service_unavailable"


class OverloadedError(ServiceUnavailableError):
    """Refused at once because the server's queue is full: nothing was done, and `Retry-After`
    (pass it in `headers`) says when the queue should have room again."""

    default_code = "overloaded"


def invalid_url(method: str, path: str, server: str) -> NotFoundError:
    """A request for a path no endpoint serves (the router's miss), named as OpenAI names it."""
    return NotFoundError(
        f"Invalid URL ({method} {path}): the {server} has no such endpoint.", code="not_found"
    )


def error_for_status(status_code: int, message: str) -> APIError:
    """An APIError for a bare HTTP status (a framework's 404 or 405, say), typed by its class."""
    if status_code == 404:
        return NotFoundError(message, code="not_found")
    error = APIError(message, code=None)
    error.status_code = status_code
    error.error_type = "invalid_request_error" if status_code < 500 else "server_error"
    return error

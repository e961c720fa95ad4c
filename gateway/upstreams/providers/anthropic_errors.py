"""Anthropic's error types, both ways: a provider's error into our UpstreamError, and our
OpenAI-style errors into Anthropic's `{"type": "error", "error": {type, message}}` for clients
of the `/v1/messages` front door. Pure.
"""

from __future__ import annotations

from typing import Any

from gateway.upstreams.providers.errors import ProviderError, openai_error_body, status_error
from protocol.errors import APIError

# Anthropic's documented error types and their HTTP statuses.
ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}
_STATUS_TYPE = {status: error_type for error_type, status in ERROR_STATUS.items()}
# Our (OpenAI-style) statuses with no Anthropic twin: 503 is "no capacity", which is what
# Anthropic's overloaded_error means; 422 is a malformed request.
_STATUS_TYPE.update({422: "invalid_request_error", 503: "overloaded_error"})


def _error_fields(parsed: Any) -> tuple[str | None, str | None]:
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return None, None
    error_type, message = error.get("type"), error.get("message")
    return (error_type if isinstance(error_type, str) else None), (
        message if isinstance(message, str) else None
    )


def anthropic_status_error(
    provider: str, status: int, parsed: Any, text: str, retry_after: float | None
) -> ProviderError:
    """An HTTP error from the Messages API. Its status decides retrying (as for any provider);
    a client's error is passed on in OpenAI's shape, keeping Anthropic's message."""
    error_type, message = _error_fields(parsed)
    message = message or text
    if error_type is not None:
        message = f"{error_type}: {message}"
    body = openai_error_body(message, "invalid_request_error") if status < 500 else None
    return status_error(provider, status, message, body=body, retry_after=retry_after)


def anthropic_stream_error(provider: str, data: dict[str, Any]) -> ProviderError:
    """An `error` event in a stream that had already started (the HTTP status was 200)."""
    error_type, message = _error_fields(data)
    text = f"{provider}: error event in stream: {error_type or 'error'}: {message or ''}".rstrip(": ")
    if error_type == "rate_limit_error":
        return ProviderError(text, kind="rate_limited", status_code=429)
    if error_type in ("invalid_request_error", "request_too_large"):
        return ProviderError(
            text,
            kind="client_error",
            status_code=ERROR_STATUS[error_type],
            retryable=False,
            body=openai_error_body(message or text, "invalid_request_error"),
        )
    # overloaded_error, api_error and anything new: the provider's trouble, maybe not another's.
    return ProviderError(
        text, kind="server_error", status_code=503 if error_type == "overloaded_error" else 502
    )


def error_type_for_status(status: int) -> str:
    """The Anthropic error type a client of the front door sees for one of our statuses."""
    if status in _STATUS_TYPE:
        return _STATUS_TYPE[status]
    return "invalid_request_error" if status < 500 else "api_error"


def anthropic_error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def anthropic_error(error: APIError) -> dict[str, Any]:
    """One of our errors as a client of the /v1/messages front door reads it."""
    return anthropic_error_body(error_type_for_status(error.status_code), error.message)

"""Provider failures as UpstreamErrors, with a `kind` for metrics and the breaker's verdict.

The retry rule is the same for every provider: 5xx, timeouts, connection errors and 429 may be
retried elsewhere; a request the provider calls malformed (400, 413, 422) is the client's and
goes back to it. A provider refusing *our* credentials or not knowing the configured model
(401, 403, 404) is a deployment fault, so it is retryable and counts against the breaker,
and the client never sees a misleading "invalid API key".
"""

from __future__ import annotations

import datetime
import email.utils
import math
import time
from collections.abc import Mapping
from typing import Any, Literal

from gateway.upstreams.base import UpstreamError

ErrorKind = Literal[
    "connect", "timeout", "server_error", "rate_limited", "client_error", "credentials", "bad_response",
    "stream_broken", "unsupported",
]  # fmt: skip


class ProviderError(UpstreamError):
    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind,
        status_code: int = 502,
        retryable: bool = True,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(
            message, status_code=status_code, retryable=retryable, body=body, retry_after=retry_after
        )
        self.kind = kind


def unsupported(provider: str, what: str) -> ProviderError:
    """A request this provider cannot serve faithfully (e.g. n > 1 on Anthropic, a token-exact
    continuation): retryable so failover tries the next target, and no verdict on the provider's
    health (the breaker ignores the kind)."""
    return ProviderError(f"{provider} cannot serve {what}", kind="unsupported", status_code=400)


def openai_error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def status_error(
    provider: str, status: int, message: str, *, body: dict[str, Any] | None, retry_after: float | None
) -> ProviderError:
    """Map an HTTP error status from a provider. `body` is the OpenAI-format error to pass through
    to the client when the error is the client's."""
    text = f"{provider} answered HTTP {status}: {message}"
    if status == 429:
        return ProviderError(text, kind="rate_limited", status_code=429, retry_after=retry_after)
    if status in (401, 403, 404):
        return ProviderError(text, kind="credentials", status_code=502)
    if status in (408, 409) or status >= 500:
        kind: ErrorKind = "timeout" if status in (408, 504) else "server_error"
        return ProviderError(text, kind=kind, status_code=503 if status == 529 else status)
    client_body = body or openai_error_body(message, "invalid_request_error")
    return ProviderError(text, kind="client_error", status_code=status, retryable=False, body=client_body)


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait, from `retry-after-ms`, or `retry-after` as seconds or an HTTP date."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            seconds = float(millis) / 1000.0
        except ValueError:
            pass
        else:
            # inf or nan would take the target out until restart (or not at all): ignore them.
            return max(seconds, 0.0) if math.isfinite(seconds) else None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        # asctime dates and "-0000" carry no zone; an HTTP-date is always GMT, never local time.
        when = when.replace(tzinfo=datetime.UTC)
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)

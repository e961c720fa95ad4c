"""Upstream failures as the client sees them, in OpenAI's error format.

The protocol's APIError hierarchy (protocol.errors) is the one family of client
errors; this module only maps what went wrong upstream onto it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.upstreams.base import UpstreamError
from protocol import APIError, RateLimitError, ServiceUnavailableError
from router.types import Target


class UpstreamRejectedError(APIError):
    """A target refused the request as the client's fault (a 4xx): relayed with its status and body."""

    def __init__(self, error: UpstreamError) -> None:
        body = error.body or {}
        detail = body.get("error") if isinstance(body.get("error"), dict) else {}
        super().__init__(
            str(detail.get("message") or error.message),
            param=detail.get("param"),
            code=detail.get("code"),
        )
        self.status_code = error.status_code
        self.error_type = str(detail.get("type") or "invalid_request_error")


def exhausted_error(model: str, failures: Sequence[tuple[Target, UpstreamError]]) -> APIError:
    """Every target we tried failed: 429 when they all were busy, else 503 naming each failure."""
    if not failures:
        return ServiceUnavailableError(
            f"No target for '{model}' is accepting requests right now (all are recovering from "
            "recent failures); retry shortly.",
            headers={"retry-after": "1"},
        )
    if all(error.status_code == 429 for _, error in failures):
        waits = [error.retry_after for _, error in failures if error.retry_after is not None]
        retry_after = max(1, math.ceil(min(waits))) if waits else 1
        return RateLimitError(
            f"Every node that may serve '{model}' is at capacity; retry in {retry_after}s.",
            code="upstream_capacity",
            headers={"retry-after": str(retry_after)},
        )
    tried = "; ".join(f"{target.target_id} ({target.region}): {error.message}" for target, error in failures)
    return ServiceUnavailableError(
        f"All {len(failures)} attempts to serve '{model}' failed: {tried}",
        headers={"retry-after": "1"},
    )

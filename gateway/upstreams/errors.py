"""How failover ends when no target served: the upstreams stage's domain errors.

gateway/errors.py maps them to OpenAI error bodies (the rejected request's own status and
body, 429 when every target was at capacity, else 503 naming each failure).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.upstreams.base import UpstreamError
from router.types import Target


class UpstreamRejected(Exception):
    """A target refused the request as the client's fault (a 4xx): the client gets that answer."""

    def __init__(self, error: UpstreamError) -> None:
        super().__init__(error.message)
        self.error = error


class UpstreamsExhausted(Exception):
    """Every target tried failed (or none was accepting requests); `failures` in attempt order."""

    def __init__(self, model: str, failures: Sequence[tuple[Target, UpstreamError]]) -> None:
        self.model = model
        self.failures = tuple(failures)
        if not failures:
            message = (
                f"No target for '{model}' is accepting requests right now (all are recovering from "
                "recent failures); retry shortly."
            )
        elif self.all_at_capacity():
            message = f"Every node that may serve '{model}' is at capacity."
        else:
            tried = "; ".join(f"{t.target_id} ({t.region}): {e.message}" for t, e in failures)
            message = f"All {len(failures)} attempts to serve '{model}' failed: {tried}"
        super().__init__(message)
        self.message = message

    def all_at_capacity(self) -> bool:
        return bool(self.failures) and all(error.at_capacity for _, error in self.failures)

    def retry_after_s(self) -> float | None:
        """The soonest Retry-After any busy target gave, if all were busy and any gave one."""
        waits = [e.retry_after for _, e in self.failures if e.retry_after is not None]
        return min(waits) if self.all_at_capacity() and waits else None

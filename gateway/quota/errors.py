"""The quota package's exceptions: what the gate decided, in its own terms.

The API edge (gateway/errors.py) turns the client-facing ones into OpenAI error answers:
QuotaExceeded -> 429, QuotaUnavailable -> 503, RequestTooLarge -> 400.
"""

from __future__ import annotations


class QuotaError(Exception):
    """Base of the quota package's exceptions."""


class QuotaStoreUnavailable(QuotaError):
    """The shared store did not answer in time (or at all); the tenant's fail_mode decides.
    The gate handles it: it never reaches a caller of QuotaGate."""


class QuotaExceeded(QuotaError):
    """The tenant is over one of its limits: refused, and it may retry after `retry_after_ms`.

    `headers` are the tenant's x-ratelimit-* headers (and x-meridian-quota when degraded) as of
    the refusal; `message` says which limit, its use and when to retry."""

    def __init__(self, tenant_id: str, message: str, *, headers: dict[str, str], retry_after_ms: int) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id
        self.message = message
        self.headers = headers
        self.retry_after_ms = retry_after_ms


class QuotaUnavailable(QuotaError):
    """The shared store cannot be asked and the tenant is fail-closed: nothing is admitted (or
    reported) for it until the store answers again, worth retrying after `retry_after_ms`."""

    def __init__(self, tenant_id: str, *, retry_after_ms: int) -> None:
        self.tenant_id = tenant_id
        self.message = (
            f"The quota store is unreachable and tenant {tenant_id}'s quota policy is fail-closed. "
            "Please retry shortly."
        )
        super().__init__(self.message)
        self.retry_after_ms = retry_after_ms


class RequestTooLarge(QuotaError):
    """The request's estimate alone exceeds one of the tenant's token limits, so it could never be
    admitted: a client error, not a reason to retry."""

    def __init__(self, tenant_id: str, *, cost: int, limit: int, what: str) -> None:
        self.tenant_id = tenant_id
        self.message = (
            f"This request may use up to {cost} tokens (prompt + max_tokens), more than tenant "
            f"{tenant_id}'s limit of {limit} {what}, so it can never be admitted. "
            "Lower max_tokens or shorten the prompt."
        )
        super().__init__(self.message)

"""The one mapping of anything raised on the gateway's request path to its client-facing error.

Domain errors (overloaded, quota denied, quota store unavailable, no route, every upstream failed)
are plain exceptions of their packages; here they become APIErrors with the right status, code and
headers. Every edge that answers a client uses it directly: the front doors' exception handlers
(gateway/api/doors.py, which also shape the door's wire format), the batches runner (whose answers
are written to output files) and the Responses runs. Nothing else maps errors, and no answer ever
leaks a stack trace.
"""

from __future__ import annotations

import logging
import math

from litestar.exceptions import HTTPException, ValidationException

from gateway.admission.errors import Overloaded
from gateway.batches.errors import (
    BatchInputError,
    BatchNotCancellable,
    BatchNotFound,
    BatchStoreUnavailable,
    FileTooLarge,
)
from gateway.call.errors import NoRouteError
from gateway.ledger.errors import BadUsageQuery, LedgerUnavailable
from gateway.quota.errors import QuotaExceeded, QuotaUnavailable, RequestTooLarge
from gateway.quota.headers import retry_after_headers
from gateway.responses.errors import ResponsesBusy
from gateway.safety.errors import ContentBlocked, SafetyUnavailable
from gateway.translate.errors import UntranslatableAnswer
from gateway.upstreams.errors import UpstreamRejected, UpstreamsExhausted
from http_server import ClientDisconnected
from protocol import (
    APIError,
    InternalServerError,
    InvalidRequestError,
    RateLimitError,
    ServiceUnavailableError,
)
from protocol.errors import (
    ClientClosedRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    error_for_status,
)

logger = logging.getLogger(__name__)


def to_api_error(exc: BaseException, *, request_id: str = "-") -> APIError:
    """The client-facing error for `exc`; an unexpected one is logged (with its request id)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, Overloaded):
        return RateLimitError(exc.message, code="overloaded", headers={"retry-after": str(exc.retry_after_s)})
    if isinstance(exc, NoRouteError):
        # Most often every node inside the residency is briefly out (ejected for 1 s at first, or
        # a missed probe, re-probed each second): a client should come back soon, not give up.
        return ServiceUnavailableError(exc.message, code="no_region_available", headers={"retry-after": "1"})
    if isinstance(exc, UpstreamsExhausted):
        return _exhausted(exc)
    if isinstance(exc, UpstreamRejected):
        return _rejected(exc)
    if isinstance(exc, UntranslatableAnswer):
        # The upstream answered what the client's API cannot say: its fault, a bad gateway.
        return error_for_status(502, exc.message)
    if isinstance(exc, QuotaExceeded):
        return RateLimitError(exc.message, headers={**exc.headers, **retry_after_headers(exc.retry_after_ms)})
    if isinstance(exc, QuotaUnavailable):
        return ServiceUnavailableError(
            exc.message, code="quota_store_unavailable", headers=retry_after_headers(exc.retry_after_ms)
        )
    if isinstance(exc, ContentBlocked):
        return InvalidRequestError(exc.args[0], code="content_policy_violation")
    if isinstance(exc, SafetyUnavailable):
        return ServiceUnavailableError(exc.args[0], code="safety_unavailable")
    if isinstance(exc, BadUsageQuery):
        return InvalidRequestError(exc.message, param=exc.param, code="invalid_usage_query")
    if isinstance(exc, LedgerUnavailable):
        return ServiceUnavailableError(str(exc), code="ledger_unavailable", headers={"retry-after": "1"})
    if isinstance(exc, FileTooLarge):
        return PayloadTooLargeError(exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, BatchInputError):
        return InvalidRequestError(exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, BatchNotCancellable):
        return ConflictError(exc.message, param="batch_id", code="batch_not_cancellable")
    if isinstance(exc, BatchNotFound):
        return NotFoundError(exc.message, param=exc.param, code="not_found")
    if isinstance(exc, BatchStoreUnavailable):
        return ServiceUnavailableError(str(exc), code="batch_store_unavailable", headers={"retry-after": "1"})
    if isinstance(exc, ResponsesBusy):
        return RateLimitError(exc.message, code="responses_busy", headers={"retry-after": "1"})
    if isinstance(exc, RequestTooLarge):
        return InvalidRequestError(exc.message, param="max_tokens", code="request_too_large")
    if isinstance(exc, ClientDisconnected):
        # The client's doing, not the gateway's: no traceback, and counted as 499, not 500.
        logger.info("request %s: the client disconnected before sending its whole request", request_id)
        return ClientClosedRequestError("The client closed the connection before sending its request.")
    if isinstance(exc, ValidationException):
        return InvalidRequestError(str(exc.detail or "Invalid request"))
    if isinstance(exc, HTTPException):
        error = error_for_status(exc.status_code, str(exc.detail or "HTTP error"))
        # The framework's own headers: a 405's `allow` lists the path's methods (RFC 9110 requires it).
        error.headers.update(exc.headers or {})
        return error
    logger.error("request %s failed with an unexpected error", request_id, exc_info=exc)
    return InternalServerError("The gateway had an error while processing your request.")


def _exhausted(exc: UpstreamsExhausted) -> APIError:
    """429 when every target was at capacity (with the soonest Retry-After they gave), else 503."""
    if exc.all_at_capacity():
        wait = exc.retry_after_s()
        retry_after = max(1, math.ceil(wait)) if wait is not None else 1
        return RateLimitError(
            f"{exc.message[:-1]}; retry in {retry_after}s.",
            code="upstream_capacity",
            headers={"retry-after": str(retry_after)},
        )
    return ServiceUnavailableError(exc.message, headers={"retry-after": "1"})


def _rejected(exc: UpstreamRejected) -> APIError:
    """The target's own answer to a request it refused as the client's fault: status and body."""
    body = exc.error.body or {}
    detail = body.get("error") if isinstance(body.get("error"), dict) else {}
    error = APIError(
        str(detail.get("message") or exc.error.message), param=detail.get("param"), code=detail.get("code")
    )
    error.status_code = exc.error.status_code
    error.error_type = str(detail.get("type") or "invalid_request_error")
    return error

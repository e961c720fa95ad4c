"""The quota package's own failures (client-facing ones are protocol APIErrors)."""

from __future__ import annotations


class QuotaError(Exception):
    """Base of the quota package's exceptions."""


class QuotaStoreUnavailable(QuotaError):
    """The shared store did not answer in time (or at all); the tenant's fail_mode decides."""

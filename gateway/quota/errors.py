"""The quota package's own failures (client-facing ones are protocol APIErrors)."""

from __future__ import annotations


class QuotaError(Exception):
    """Base of the quota package's exceptions."""


class QuotaConfigError(QuotaError, ValueError):
    """The `quota` config section is invalid; the message names the field."""


class QuotaStoreUnavailable(QuotaError):
    """The shared store did not answer in time (or at all); the tenant's fail_mode decides."""

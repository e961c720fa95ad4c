"""The ledger's domain errors; gateway/errors.py maps them to HTTP."""

from __future__ import annotations


class LedgerError(Exception):
    pass


class BadUsageQuery(LedgerError):
    """A usage or costs query parameter is invalid (400, naming it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class LedgerUnavailable(LedgerError):
    """The ledger store cannot answer (503)."""

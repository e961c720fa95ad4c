"""The Responses store's domain errors (mapped to HTTP in gateway/errors.py)."""

from __future__ import annotations


class ResponsesBusy(Exception):
    """No room for another run: the background limit, or the store is full of running ones."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

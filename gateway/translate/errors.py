"""The error of a request one API cannot express in the other."""

from __future__ import annotations


class TranslationError(Exception):
    """The request cannot be expressed in the other API (e.g. tool messages, images)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

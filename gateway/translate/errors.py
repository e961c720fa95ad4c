"""The errors of what one API cannot express in the other."""

from __future__ import annotations


class TranslationError(Exception):
    """The request cannot be expressed in the other API (e.g. images, server tools): a 400."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UntranslatableAnswer(Exception):
    """The upstream's answer cannot be expressed in the client's API (a tool call whose arguments
    are not a JSON object cannot be a tool_use block): the upstream's fault, a 502."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

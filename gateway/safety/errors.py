"""The safety package's exceptions; gateway/errors.py maps them to HTTP once."""

from __future__ import annotations


class SafetyError(Exception):
    """Base of the safety layer's errors."""


class ContentBlocked(SafetyError):
    """A check blocked the request's input: a 400 `content_policy_violation` naming the rule or
    category (never the matched text)."""

    def __init__(self, where: str, layer: str, name: str) -> None:
        self.where = where
        self.layer = layer
        self.name = name
        super().__init__(f"The request's {where} was blocked by the content policy ({layer}: {name}).")


class SafetyUnavailable(SafetyError):
    """A check could not answer (error, timeout, classifier not ready) and the tenant's policy
    fails closed: a 503, the request not served."""

    def __init__(self, layer: str, why: str) -> None:
        self.layer = layer
        self.why = why
        super().__init__(f"The content check ({layer}) is unavailable ({why}) and the policy fails closed.")


class ClassifierError(SafetyError):
    """The classifier could not score a text: not loaded, queue full, timed out or failed."""

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(why)

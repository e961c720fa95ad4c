"""The request stage's domain errors; gateway/api/errors.py maps them to HTTP."""

from __future__ import annotations


class NoRouteError(Exception):
    """No target allowed for this tenant can serve the model right now."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(f"No region allowed for this tenant can serve '{model}' right now: {why}")
        self.model = model
        self.message = str(self)

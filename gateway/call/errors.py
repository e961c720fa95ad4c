"""The request stage's domain errors; gateway/errors.py maps them to HTTP."""

from __future__ import annotations


class NoRouteError(Exception):
    """No target this tenant may use can serve the model right now; `why` says what ruled each out
    (residency only where the tenant has a residency limit)."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(f"No upstream can serve '{model}' for this tenant right now: {why}")
        self.model = model
        self.why = why
        self.message = str(self)

"""Admission's domain error; gateway/errors.py maps it to a 429 `overloaded` with Retry-After."""

from __future__ import annotations

from typing import Literal

# queue_full: the tier's gateway queue was full; deadline: the request waited queue_deadline_s;
# over_target: the tier does not queue (queue_deadline_s: 0).
ShedReason = Literal["queue_full", "deadline", "over_target"]


class Overloaded(Exception):
    """The request's pool is over its traffic tier's target and the request cannot wait for it."""

    def __init__(self, *, model: str, tier: str, reason: ShedReason, retry_after_s: int) -> None:
        why = {
            "queue_full": f"the {tier} queue is full",
            "deadline": f"the {tier} queue's deadline passed before capacity freed up",
            "over_target": f"{tier} requests do not queue",
        }[reason]
        super().__init__(
            f"'{model}' is overloaded: its estimated queueing delay is over the {tier} target and "
            f"{why}. Retry in {retry_after_s}s."
        )
        self.model = model
        self.tier = tier
        self.reason: ShedReason = reason
        self.retry_after_s = retry_after_s
        self.message = str(self)

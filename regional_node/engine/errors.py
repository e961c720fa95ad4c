"""The engine's one exception hierarchy; the node's HTTP layer maps these to OpenAI error bodies."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose. The engine keeps serving after any of them."""


class InvalidRequestError(EngineError, ValueError):
    """A request the engine will never run as given: empty prompt, bad sampling values, bad token ids.

    `param` names the offending field (OpenAI's `param`), e.g. "max_tokens" or "prompt".
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ContextLengthExceededError(InvalidRequestError):
    """The prompt (plus max_tokens) does not fit in the model's context window."""

    def __init__(self, message: str, param: str | None = "prompt") -> None:
        super().__init__(message, param)


class RequestTooLargeError(EngineError):
    """The request would need more KV-cache blocks than the whole pool holds, so it can never run."""


class QueueFullError(EngineError):
    """Refused before entering the engine: its tier's queue is at its bound (`reason`
    "queue_tokens") or its estimated wait is past the tier's limit ("queue_wait").

    `retry_after_s` (whole seconds, at least 1) is how long the engine needs, at its measured
    drain rate, to work the queue down far enough to admit the request.
    """

    def __init__(self, message: str, *, tier: str, reason: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.tier = tier
        self.reason = reason
        self.retry_after_s = retry_after_s


class CheckpointError(EngineError):
    """A checkpoint folder that cannot be loaded: missing config or weights, corrupt or mismatched tensors."""


class UnsupportedArchitectureError(CheckpointError):
    """config.json names an architecture (or a feature of one) this engine does not implement."""

    def __init__(self, message: str, architecture: str | None = None) -> None:
        super().__init__(message)
        self.architecture = architecture


class EngineConfigError(EngineError, ValueError):
    """An engine option out of range (block_size, pool size, dtype, ...), found at start-up."""


class StepFailedError(EngineError):
    """A model step raised; the requests it was running (`request_ids`) have been failed and freed."""

    def __init__(self, message: str, request_ids: list[str]) -> None:
        super().__init__(message)
        self.request_ids = request_ids

"""The OpenAI-compatible wire protocol that Meridian's nodes and gateway both speak.

Torch-free on purpose: the gateway imports it without loading the engine.
"""

from protocol.errors import (
    APIError,
    AuthenticationError,
    ContextLengthError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
)
from protocol.openai import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    StreamOptions,
    Usage,
    decode_request,
)

__all__ = [
    "APIError",
    "AuthenticationError",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContextLengthError",
    "InternalServerError",
    "InvalidRequestError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServiceUnavailableError",
    "StreamOptions",
    "Usage",
    "decode_request",
]

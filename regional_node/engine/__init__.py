"""Meridian's inference engine: paged KV cache, prefix caching, continuous batching, fair scheduling.

See README.md in this folder for the design and the options.
"""

from regional_node.engine.admission import QueueLimits
from regional_node.engine.async_engine import AsyncEngine
from regional_node.engine.config import EngineConfig, ModelConfig
from regional_node.engine.errors import (
    CheckpointError,
    ContextLengthExceededError,
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    QueueFullError,
    RequestTooLargeError,
    StepFailedError,
    UnsupportedArchitectureError,
)
from regional_node.engine.llm_engine import LLMEngine
from regional_node.engine.outputs import FinishReason, RequestDelta, RequestOutput
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.tokenizer import Tokenizer

__all__ = [
    "AsyncEngine",
    "CheckpointError",
    "ContextLengthExceededError",
    "EngineConfig",
    "EngineConfigError",
    "EngineError",
    "FinishReason",
    "InvalidRequestError",
    "LLMEngine",
    "ModelConfig",
    "QueueFullError",
    "QueueLimits",
    "RequestDelta",
    "RequestOutput",
    "RequestTooLargeError",
    "SamplingParams",
    "StepFailedError",
    "Tokenizer",
    "UnsupportedArchitectureError",
]

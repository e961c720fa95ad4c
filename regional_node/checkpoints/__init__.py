"""Random-initialised Llama / Qwen2 checkpoints in the Hugging Face layout, for tests and demos."""

from regional_node.checkpoints.errors import CheckpointError, CheckpointExistsError, VocabularyTooLargeError
from regional_node.checkpoints.sizes import ARCHES, SIZES, Arch, ModelShape, shape_for
from regional_node.checkpoints.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS
from regional_node.checkpoints.writer import CheckpointSummary, init_checkpoint, write_checkpoint

__all__ = [
    "ARCHES",
    "CHAT_TEMPLATE",
    "SIZES",
    "SPECIAL_TOKENS",
    "Arch",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointSummary",
    "ModelShape",
    "VocabularyTooLargeError",
    "init_checkpoint",
    "shape_for",
    "write_checkpoint",
]

"""Errors raised while writing local checkpoints."""


class CheckpointError(Exception):
    """Base class for checkpoint-writing failures."""


class CheckpointExistsError(CheckpointError):
    """The target folder already holds files and overwriting was not asked for."""


class VocabularyTooLargeError(CheckpointError):
    """The bundled corpus cannot train a tokenizer with that many tokens."""

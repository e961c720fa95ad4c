"""Incremental detokenization that never emits half of a multi-byte character.

The prefix-offset / read-offset technique (as in vLLM and TGI): decode a short window of tokens
before the new ones and the window plus the new ones, and emit the difference, but only when the
decoded text does not end in U+FFFD (an incomplete UTF-8 sequence, finished by a later token).
Decoding a window, rather than the new token alone, keeps word-boundary spaces and merges right.
"""

from __future__ import annotations

from regional_node.engine.tokenizer import Tokenizer

# Prompt tokens kept as left context for the first generated tokens.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int]) -> None:
        self._tok = tokenizer
        self._ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._read = len(self._ids)
        self._prefix = 0

    def push(self, token_id: int) -> str:
        """Add one generated token; returns the text that became final (possibly empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the sequence: whatever is left, even an incomplete character."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        if len(text) > len(prefix_text) and (final or not text.endswith("\ufffd")):
            self._prefix, self._read = self._read, len(self._ids)
            # Drop tokens no longer needed as context, so decoding stays O(window) per token.
            if self._prefix > _CONTEXT_TOKENS:
                cut = self._prefix - _CONTEXT_TOKENS
                del self._ids[:cut]
                self._prefix -= cut
                self._read -= cut
            return text[len(prefix_text) :]
        if final:
            self._read = len(self._ids)
        return ""

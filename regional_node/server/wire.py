"""Pieces of the OpenAI wire format that chat and completions share: ids, usage, token strings."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from protocol.openai import (
    ChatCompletionRequest,
    ChatLogprobToken,
    CompletionLogprobs,
    CompletionRequest,
    PromptTokensDetails,
    Usage,
)

if TYPE_CHECKING:
    from regional_node.engine.outputs import Alternatives
    from regional_node.engine.tokenizer import Tokenizer


RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)


class ResponseFormat(Generic[RequestT]):
    """What chat and completions formats both hold: the request, its response id, model and creation time."""

    def __init__(self, request: RequestT, response_id: str, model: str, tokenizer: Tokenizer | None) -> None:
        self.request = request
        self.response_id = response_id
        self.model = model
        self.created = now()
        self._tokenizer = tokenizer

    def _token_ids(self, token_ids: list[int]) -> list[int] | None:
        return list(token_ids) if self.request.return_token_ids else None


def new_id(prefix: str) -> str:
    """`chatcmpl-…` / `cmpl-…`: unique per request, also the engine's request id."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def token_strings(tokenizer: Tokenizer | None, token_ids: Sequence[int]) -> list[str]:
    """Each token on its own, as logprobs report it (special tokens included)."""
    if tokenizer is None:
        # vLLM's spelling for a token without a tokenizer.
        return [f"token_id:{token}" for token in token_ids]
    return [tokenizer.decode([token], skip_special_tokens=False) for token in token_ids]


def chat_logprob_tokens(
    tokenizer: Tokenizer | None,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[Alternatives] | None,
) -> list[ChatLogprobToken]:
    """Chat `logprobs.content` entries; `tops`: each token's alternatives when the request asked
    for `top_logprobs` (None: it did not, and each entry's list is empty)."""
    entries = []
    for i, (text, logprob) in enumerate(zip(token_strings(tokenizer, token_ids), logprobs, strict=False)):
        alternatives = []
        if tops is not None and i < len(tops):
            ids = [token for token, _ in tops[i]]
            for alt_text, (_, alt_logprob) in zip(token_strings(tokenizer, ids), tops[i], strict=True):
                alternatives.append(
                    {"token": alt_text, "logprob": alt_logprob, "bytes": list(alt_text.encode("utf-8"))}
                )
        raw = list(text.encode("utf-8"))
        entries.append(ChatLogprobToken(token=text, logprob=logprob, bytes=raw, top_logprobs=alternatives))
    return entries


def completion_logprobs(
    tokenizer: Tokenizer | None,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    tops: Sequence[Alternatives] | None,
    text_offset: int,
) -> CompletionLogprobs:
    """Legacy completions `logprobs`; `text_offset` is where this piece starts in the output text.
    `tops`: each token's alternatives when the request asked for `logprobs` > 0 (None: it asked
    for 0, and there is no `top_logprobs`). Alternatives are keyed by their text, as OpenAI's are:
    two tokens that decode alike keep the more likely."""
    tokens = token_strings(tokenizer, token_ids)
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    values = list(logprobs[: len(tokens)])
    top_logprobs = None
    if tops is not None:
        top_logprobs = []
        for alternatives in tops[: len(tokens)]:
            texts = token_strings(tokenizer, [token for token, _ in alternatives])
            by_text: dict[str, float] = {}
            for text, (_, value) in zip(texts, alternatives, strict=True):
                by_text.setdefault(text, value)
            top_logprobs.append(by_text)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=values, top_logprobs=top_logprobs, text_offset=offsets
    )

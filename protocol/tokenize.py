"""vLLM's `/tokenize` and `/detokenize` bodies: a prompt as the node's model sees it, in tokens.

The gateway counts a request's input tokens with them (`/v1/messages/count_tokens`,
`/v1/responses/input_tokens`): the node renders the chat template and tokenizes exactly as it does
for a generation, so the count is the `prompt_tokens` a generation of the same messages reports.
A body holds `prompt` (text) or `messages` (a conversation), never both.
"""

from __future__ import annotations

import msgspec

from protocol.openai import ChatMessage


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # vLLM's defaults: special tokens (BOS) added to a prompt, not to a conversation, whose
    # template writes its own.
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str

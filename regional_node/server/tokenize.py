"""`POST /tokenize` and `POST /detokenize`, vLLM's shapes (protocol/tokenize.py).

A conversation is rendered and tokenized by the same code as a chat generation's prompt
(server/prompts.py), so its count is the `prompt_tokens` that generation reports; the gateway's
token-counting doors rely on it. Nothing here touches the engine's queue or KV cache.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from protocol import ChatCompletionRequest, InvalidRequestError
from protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from regional_node.server.errors import api_error
from regional_node.server.pool import ModelPool
from regional_node.server.prompts import chat_messages, chat_prompt_ids

if TYPE_CHECKING:
    from regional_node.engine.tokenizer import Tokenizer


def _needs(tokenizer: Tokenizer | None, what: str) -> Tokenizer:
    if tokenizer is None:
        raise InvalidRequestError(f"This model has no tokenizer, so it cannot {what}.", param="model")
    return tokenizer


def _prompt_ids(tokenizer: Tokenizer | None, body: TokenizeRequest) -> list[int]:
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequestError("Send exactly one of `prompt` and `messages`.", param="messages")
    tokenizer = _needs(tokenizer, "tokenize text")
    if body.prompt is not None:
        return tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
    chat = ChatCompletionRequest(
        model=body.model,
        messages=body.messages or [],
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
    )
    if not body.add_special_tokens:
        return chat_prompt_ids(tokenizer, chat)  # the generation's own prompt
    text = tokenizer.render_chat(chat_messages(chat), body.add_generation_prompt, body.continue_final_message)
    return tokenizer.encode(text, add_special_tokens=True)


async def tokenize(pool: ModelPool, body: TokenizeRequest) -> TokenizeResponse:
    model = pool.get(body.model)
    tokenizer = model.engine.tokenizer
    param = "prompt" if body.prompt is not None else "messages"
    try:
        ids = await asyncio.to_thread(_prompt_ids, tokenizer, body)
    except Exception as exc:
        raise api_error(exc, prompt_param=param) from None
    strs = None
    if body.return_token_strs and tokenizer is not None:
        strs = [tokenizer.id_to_token(i) or "" for i in ids]
    return TokenizeResponse(count=len(ids), max_model_len=model.max_model_len, tokens=ids, token_strs=strs)


async def detokenize(pool: ModelPool, body: DetokenizeRequest) -> DetokenizeResponse:
    tokenizer = _needs(pool.get(body.model).engine.tokenizer, "detokenize")
    for index, token in enumerate(body.tokens):
        if not 0 <= token < tokenizer.vocab_size:
            raise InvalidRequestError(
                f"Token id {token} is outside this model's vocabulary (0 to {tokenizer.vocab_size - 1}).",
                param=f"tokens[{index}]",
            )
    text = await asyncio.to_thread(tokenizer.decode, body.tokens, False)
    return DetokenizeResponse(prompt=text)

"""Requests to prompt token ids: chat messages through the model's chat template, completion
prompts as text or token ids. Unsupported content is a 400 naming the field, found here before
the engine sees anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol import ChatCompletionRequest, CompletionRequest, InvalidRequestError

if TYPE_CHECKING:
    from regional_node.engine.tokenizer import Tokenizer

# OpenAI's newer "developer" role plays the part of "system" for templates that predate it.
_TEMPLATE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_TEXT_PART_TYPES = ("text", "input_text", "output_text")


def chat_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The conversation as the plain `{"role", "content"}` dicts a chat template expects."""
    if not request.messages:
        raise InvalidRequestError("`messages` must contain at least one message.", param="messages")
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(request.messages):
        role = _TEMPLATE_ROLES.get(message.role)
        if role is None:
            raise InvalidRequestError(
                f"Messages with role `{message.role}` are not supported (tools are not available on this node).",
                param=f"messages[{index}].role",
            )
        if isinstance(message.content, list):
            for part_index, part in enumerate(message.content):
                if part.type not in _TEXT_PART_TYPES:
                    raise InvalidRequestError(
                        f"Content parts of type `{part.type}` are not supported; only text is.",
                        param=f"messages[{index}].content[{part_index}].type",
                    )
        messages.append({"role": role, "content": message.text()})
    if request.continue_final_message and messages[-1]["role"] != "assistant":
        raise InvalidRequestError(
            "`continue_final_message` needs the last message to be from the assistant.", param="messages"
        )
    return messages


def chat_prompt_ids(tokenizer: Tokenizer | None, request: ChatCompletionRequest) -> list[int]:
    """Render and tokenize the conversation; engine errors from the template propagate."""
    messages = chat_messages(request)
    if tokenizer is None:
        raise InvalidRequestError(
            "This model has no tokenizer, so it cannot serve chat; send token ids to /v1/completions.",
            param="model",
        )
    # Continuing the final message means no new assistant turn is opened, whatever the flag says.
    add_generation_prompt = request.add_generation_prompt and not request.continue_final_message
    return tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=request.continue_final_message,
    )


def completion_prompt(request: CompletionRequest) -> str | list[int]:
    """The one prompt of a completions request: text, or token ids. Batches are a 400."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise InvalidRequestError("`prompt` must not be empty.", param="prompt")
    if all(isinstance(item, int) for item in prompt):
        return [int(item) for item in prompt]  # type: ignore[arg-type]
    if len(prompt) == 1 and isinstance(prompt[0], str | list):
        only = prompt[0]
        return only if isinstance(only, str) else list(only)
    if all(isinstance(item, str) for item in prompt) or all(isinstance(item, list) for item in prompt):
        raise InvalidRequestError(
            "Batched prompts are not supported; send one prompt per request.", param="prompt"
        )
    raise InvalidRequestError(
        "`prompt` must be a string, a list of strings, token ids, or a list of token-id lists.",
        param="prompt",
    )


def completion_prompt_ids(tokenizer: Tokenizer | None, prompt: str | list[int]) -> list[int]:
    """Token ids for a completion prompt; text needs the model's tokenizer."""
    if isinstance(prompt, list):
        return prompt
    if tokenizer is None:
        raise InvalidRequestError(
            "This model has no tokenizer; send the prompt as token ids.", param="prompt"
        )
    ids = tokenizer.encode(prompt)
    if not ids:
        # OpenAI accepts an empty prompt (it starts from the beginning-of-text token); so do we.
        bos = tokenizer.token_to_id(tokenizer.bos_token) if tokenizer.bos_token else None
        start = bos if bos is not None else next(iter(tokenizer.eos_token_ids), None)
        ids = [start] if start is not None else []
    if not ids:
        raise InvalidRequestError("`prompt` is empty.", param="prompt")
    return ids

"""A streamed answer put back together as the non-streamed response the client asked for.

The confidence cascade streams from the small model even when the client did not ask for a
stream, so that it can decide on the first tokens and abort early. When the small model keeps the
request, the relayed chunks are collected here into OpenAI's `chat.completion` /
`text_completion` shape: every text channel and the logprobs concatenated per choice, tool-call
fragments joined by index, the last finish reason with its matched stop (vLLM's `stop_reason`,
which the /v1/messages door answers as `stop_sequence`), and the usage the relay settled on. A
content no chunk carried stays null (a tool-call answer's), as the upstream's own answer has it.
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec import UNSET

from gateway.upstreams.base import Endpoint
from protocol.chunk import Choice, Chunk, Completion, FunctionCall, Logprobs, Message, ToolCall, Usage

_OBJECT = {"chat": "chat.completion", "completions": "text_completion"}


def collect(endpoint: Endpoint, chunks: Iterable[Chunk], usage: Usage | None) -> Completion:
    response = Completion(object=_OBJECT[endpoint])
    choices: dict[int, Choice] = {}
    for chunk in chunks:
        if not response.id:
            response.id, response.created, response.model = chunk.id, chunk.created, chunk.model
        if response.system_fingerprint is UNSET and chunk.system_fingerprint is not UNSET:
            response.system_fingerprint = chunk.system_fingerprint
        for part in chunk.choices:
            choice = choices.get(part.index)
            if choice is None:
                choice = choices[part.index] = _empty(endpoint, part.index)
            _merge(choice, part)
    response.choices = [_finished(choices[i]) for i in sorted(choices)]
    if usage is not None:
        response.usage = usage
    return response


def _empty(endpoint: Endpoint, index: int) -> Choice:
    if endpoint == "chat":
        return Choice(index=index, message=Message(role="assistant", content=None))
    return Choice(index=index, text="")


def _merge(choice: Choice, part: Choice) -> None:
    if part.finish_reason:
        choice.finish_reason = part.finish_reason
        choice.stop_reason = part.stop_reason
    if isinstance(part.token_ids, list):
        choice.token_ids = [*(choice.token_ids or []), *part.token_ids]
    if part.logprobs is not None:
        choice.logprobs = _joined(choice.logprobs, part.logprobs)
    if isinstance(choice.text, str):
        choice.text += part.content()
        return
    message, delta = choice.message, part.delta
    assert isinstance(message, Message)
    if not isinstance(delta, Message):
        return
    if isinstance(delta.content, str):
        message.content = (message.content or "") + delta.content
    for name in ("refusal", "reasoning_content"):
        piece = getattr(delta, name)
        if isinstance(piece, str):
            before = getattr(message, name)
            setattr(message, name, (before if isinstance(before, str) else "") + piece)
    for position, call in enumerate(delta.tool_calls or ()):
        calls = message.tool_calls if isinstance(message.tool_calls, list) else []
        message.tool_calls = calls
        index = call.index if isinstance(call.index, int) else position
        slot = next((c for c in calls if c.index == index), None)
        if slot is None:
            slot = ToolCall(index=index, function=FunctionCall(arguments=""))
            calls.append(slot)
        if call.id:
            slot.id = call.id
        if call.type:
            slot.type = call.type
        if call.function is not UNSET:
            function = slot.function
            assert isinstance(function, FunctionCall)
            if call.function.name:
                function.name = call.function.name
            function.arguments = (function.arguments or "") + (call.function.arguments or "")


def _joined(into: Logprobs | None, part: Logprobs) -> Logprobs:
    if into is None:
        into = Logprobs()
    for name in ("content", "refusal", "tokens", "token_logprobs", "top_logprobs", "text_offset"):
        values = getattr(part, name)
        if isinstance(values, list):
            before = getattr(into, name)
            setattr(into, name, [*(before if isinstance(before, list) else []), *values])
    return into


def _finished(choice: Choice) -> Choice:
    message = choice.message
    if isinstance(message, Message) and isinstance(message.tool_calls, list):
        message.tool_calls.sort(key=lambda call: call.index if isinstance(call.index, int) else 0)
        for call in message.tool_calls:
            call.index = UNSET  # a whole message's tool calls carry no index
    return choice

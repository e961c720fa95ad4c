"""The chat request another door's request is served as, and where each of its messages came from.

The pipeline speaks chat: its errors name chat fields (`messages[3].tool_calls`, `max_tokens`).
A client of `/v1/messages` or `/v1/responses` sent no such field, and the index of a chat message
is not the index of the turn or item it came from (a system prompt, a Messages turn's tool
results, a Responses call beside its message all shift it). So each translation keeps, for every
chat message, the field of the client's request it came from, and an error is renamed into the
client's terms at the door.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from protocol import ChatCompletionRequest
from protocol.errors import APIError

_MESSAGE_PARAM = re.compile(r"messages\[(\d+)\].*")


@dataclass(frozen=True)
class ChatRequest:
    """`body` (the chat request as sent upstream), its struct `parsed`, `sources[k]` (the client's
    field that chat message k came from) and `renamed` (other chat fields the client's request
    calls otherwise, e.g. Responses' `max_output_tokens`)."""

    body: dict[str, Any]
    parsed: ChatCompletionRequest
    sources: tuple[str, ...]
    renamed: Mapping[str, str] = field(default_factory=dict)

    def in_request_terms(self, error: APIError) -> APIError:
        """`error` (the pipeline's, about the chat request) naming the client's field: a chat
        message's (`messages[3].role`) becomes the field it came from (`input[2]`, or
        `messages[1].content[0]`), with the rest of the chat path dropped, as it names a chat
        field the client's request does not have."""
        param = error.param
        if param is None:
            return error
        found = _MESSAGE_PARAM.fullmatch(param)
        if found is not None and int(found.group(1)) < len(self.sources):
            renamed = self.sources[int(found.group(1))]
        else:
            renamed = self.renamed.get(param, param)
        error.message = error.message.replace(f"`{param}`", f"`{renamed}`")
        error.param = renamed
        return error

    @contextmanager
    def errors_in_request_terms(self) -> Iterator[None]:
        """Around the pipeline's call: its APIError leaves renamed by `in_request_terms`."""
        try:
            yield
        except APIError as error:
            raise self.in_request_terms(error) from None

"""msgspec structs for the Messages API requests the `/v1/messages` front door accepts.

Only what Meridian can serve is modelled: text content. Other block types (images, tools,
documents) decode as `ContentBlock` with their `type` and are refused with a 400 that names
them. The fields that would change the answer if ignored (`tools`, `tool_choice`, `thinking`) are
decoded so the door can refuse them by name; other unknown top-level fields are accepted and
ignored, as the SDKs send optional ones.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec


class ContentBlock(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class InputMessage(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: str
    budget_tokens: int | None = None


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1)]
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: Metadata | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesCountRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/messages/count_tokens`: a Messages request's conversation, without its sampling
    settings (no `max_tokens`). Its fields are refused as `/v1/messages` refuses them."""

    model: str
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1)]
    system: str | list[ContentBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    def as_messages_request(self) -> MessagesRequest:
        """The Messages request it counts (one output token asked, which is not counted)."""
        return MessagesRequest(
            model=self.model,
            max_tokens=1,
            messages=self.messages,
            system=self.system,
            tools=self.tools,
            tool_choice=self.tool_choice,
            thinking=self.thinking,
        )

"""msgspec structs for the Messages API requests the `/v1/messages` front door accepts.

Modelled is what Meridian can serve: text, and client tools (definitions, `tool_choice`, the
assistant's `tool_use` blocks and the user's `tool_result` blocks). A message is a union tagged
by `role`, its content blocks one tagged by `type`; a block of another type (image, document,
thinking, a server tool's result), or in the other role's message, is refused by the decoder with
a 400 naming its `type` and where it is. A tool of a `type` other than "custom" (a server tool
such as `web_search_20250305`, which has no `input_schema`) decodes, so that the translator can
refuse it by name; so does `thinking`, which would change the answer if ignored. Other unknown
fields (`cache_control`, `citations`, ...) are accepted and ignored, as the SDKs send optional
ones.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType


class TextBlock(msgspec.Struct, kw_only=True, tag="text"):
    text: str


class ToolUseBlock(msgspec.Struct, kw_only=True, tag="tool_use"):
    """An assistant's call of a tool, with the input it gave it."""

    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct, kw_only=True, tag="tool_result"):
    """A user's answer to the tool_use block `tool_use_id`."""

    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool = False


class UserMessage(msgspec.Struct, kw_only=True, tag_field="role", tag="user"):
    content: str | list[TextBlock | ToolResultBlock]


class AssistantMessage(msgspec.Struct, kw_only=True, tag_field="role", tag="assistant"):
    content: str | list[TextBlock | ToolUseBlock]


# Tagged by `role`: which blocks a message may hold depends on who says it.
InputMessage = UserMessage | AssistantMessage


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


class Tool(msgspec.Struct, kw_only=True):
    """A client tool: the model may call it, the client runs it. `input_schema` is required of a
    client tool; it may be left out here so that a server tool (which has none) is refused by its
    `type` rather than by a missing field."""

    name: str
    input_schema: dict[str, Any] | UnsetType = UNSET
    description: str | None = None
    type: str | UnsetType = UNSET  # "custom" or left out
    strict: bool | None = None  # the input is guaranteed to follow input_schema


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # the tool to call, with type "tool"
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: str
    budget_tokens: int | None = None


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    # Anthropic's ranges (its API refuses more; a client written against it expects the same 400).
    temperature: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stream: bool = False
    metadata: Metadata | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesCountRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/messages/count_tokens`: a Messages request's conversation and tools, without its
    sampling settings (no `max_tokens`). Its fields are refused as `/v1/messages` refuses them."""

    model: str
    messages: Annotated[list[InputMessage], msgspec.Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
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

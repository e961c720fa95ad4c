"""msgspec structs for the Messages API requests the `/v1/messages` front door accepts.

Only what Meridian can serve is modelled: text content. Other block types (images, tools,
documents) decode as `ContentBlock` with their `type` and are refused with a 400 that names
them. Unknown top-level fields are accepted and ignored, as the SDKs send optional ones.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class ContentBlock(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class InputMessage(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


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

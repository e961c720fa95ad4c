"""Upstream for Anthropic's Messages API: OpenAI chat requests in, OpenAI responses and chunks out.

The translation itself is pure (gateway/translate, anthropic_stream); this module adds the
wire: `POST {base_url}/v1/messages` with `x-api-key` and `anthropic-version`, the timeouts, and
error mapping. Only the chat endpoint exists on Anthropic; legacy completions are refused as
"unsupported" so failover moves on without holding it against the provider.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.http import Connection, ConnectionPool
from gateway.translate.anthropic_to_openai_answers import messages_to_chat_response
from gateway.translate.errors import TranslationError
from gateway.translate.openai_to_anthropic import chat_to_messages
from gateway.upstreams.base import Endpoint
from gateway.upstreams.providers.anthropic_errors import anthropic_status_error
from gateway.upstreams.providers.anthropic_stream import MessagesToChatStream
from gateway.upstreams.providers.config import ProviderEntry
from gateway.upstreams.providers.errors import unsupported
from gateway.upstreams.providers.http_adapter import HTTPProviderAdapter
from gateway.upstreams.providers.transport import (
    Post,
    build_post,
    decode_event,
    destination,
    drain,
    sse_events,
    typed_completion,
)
from protocol.chunk import Chunk, Completion, chunk_from

# What the count API takes: the conversation, and the tools the model is told of (they are input
# tokens too), not the sampling settings.
_COUNTED_FIELDS = ("model", "messages", "system", "tools", "tool_choice")


class AnthropicAdapter(HTTPProviderAdapter):
    def __init__(self, entry: ProviderEntry, api_key: str, *, pool: ConnectionPool | None = None) -> None:
        auth = {"x-api-key": api_key, "anthropic-version": entry.anthropic_version}
        super().__init__(entry, auth=auth, on_status=anthropic_status_error, pool=pool)
        self._to = destination(entry.base_url.rstrip("/") + "/v1/messages")
        self._count_to = destination(entry.base_url.rstrip("/") + "/v1/messages/count_tokens")

    def _messages(self, body: dict[str, Any], *, stream: bool) -> tuple[dict[str, Any], str]:
        """The Messages request for a chat body, and the logical model name."""
        logical, provider_model = self._models(body)
        try:
            messages = chat_to_messages(
                {**body, "stream": stream},
                model=provider_model,
                default_max_tokens=self.entry.default_max_tokens,
            )
        except TranslationError as exc:
            raise unsupported(self.entry.id, f"this request ({exc.param}: {exc.message})") from None
        return messages, logical

    def _request(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str], *, stream: bool
    ) -> tuple[Post, str]:
        if endpoint != "chat":
            raise unsupported(self.entry.id, "the legacy completions endpoint")
        messages, logical = self._messages(body, stream=stream)
        return build_post(self._to, messages, auth=self._auth, client_headers=headers), logical

    async def count_tokens(self, body: dict[str, Any], headers: dict[str, str]) -> int:
        messages, _ = self._messages(body, stream=False)
        counted = {name: messages[name] for name in _COUNTED_FIELDS if name in messages}
        return await self._fetch_count(
            build_post(self._count_to, counted, auth=self._auth, client_headers=headers)
        )

    async def complete(self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]) -> Completion:
        request, logical = self._request(endpoint, body, headers, stream=False)
        message = await self._fetch_json(request)
        if message.get("type") == "error":
            raise anthropic_status_error(self.entry.id, 500, message, "", None)
        return typed_completion(
            self.entry.id, messages_to_chat_response(message, model=logical, created=int(time.time()))
        )

    @contextlib.asynccontextmanager
    async def stream(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        request, logical = self._request(endpoint, body, headers, stream=True)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        translator = MessagesToChatStream(
            provider=self.entry.id, model=logical, created=int(time.time()), include_usage=include_usage
        )
        response = await self._open(request)
        chunks = self._chunks(response, translator)
        try:
            yield chunks
        finally:
            await chunks.aclose()
            self._release(response)

    async def _chunks(self, response: Connection, translator: MessagesToChatStream) -> AsyncIterator[Chunk]:
        events = sse_events(response, provider=self.entry.id, timeouts=self.entry.timeouts)
        try:
            async for event in events:
                for chunk in translator.feed(event.event, decode_event(self.entry.id, event)):
                    yield chunk_from(chunk)
                if translator.stopped:
                    await drain(response, idle_s=self.entry.timeouts.idle_s)
                    return
        finally:
            await events.aclose()
        translator.end()

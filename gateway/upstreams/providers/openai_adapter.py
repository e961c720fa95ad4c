"""Upstream for OpenAI and any OpenAI-compatible API (chat/completions and completions).

The body is already OpenAI's; the adapter swaps the logical model name for the provider's,
drops Meridian's extension fields (OpenAI rejects unknown arguments), authenticates with the
provider's key, and forwards none of the gateway's internal headers. Responses come back with
the logical model name, so clients see the name they asked for whichever target served it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from msgspec import UNSET

from gateway.http import Connection, ConnectionPool
from gateway.upstreams.base import Endpoint
from gateway.upstreams.providers.config import ProviderEntry
from gateway.upstreams.providers.errors import ProviderError, status_error
from gateway.upstreams.providers.http_adapter import HTTPProviderAdapter
from gateway.upstreams.providers.transport import (
    Post,
    build_post,
    decode_chunk,
    destination,
    drain,
    sse_events,
    typed_completion,
)
from protocol.chunk import Chunk, Completion

_PATHS: dict[str, str] = {"chat": "/chat/completions", "completions": "/completions"}
# Meridian/vLLM extensions our nodes understand and OpenAI would reject.
_EXTENSIONS = frozenset(
    {
        "top_k",
        "ignore_eos",
        "stop_token_ids",
        "return_token_ids",
        "add_generation_prompt",
        "continue_final_message",
        "speculative",
    }
)


def _text(content: Any) -> str:
    """A chat message's text: a string, or its text parts joined (the door refused others)."""
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _input_items(messages: list[Any]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: a message keeps its role and text; an
    assistant's tool calls become `function_call` items and a tool message `function_call_output`."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        text = _text(message.get("content"))
        if message.get("role") == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message.get("tool_call_id"), "output": text}
            )
            continue
        if text or not message.get("tool_calls"):
            items.append({"role": message.get("role"), "content": text})
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments") or "",
                    }
                )
    return items


def _responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat tool (`{"type": "function", "function": {...}}`) as a Responses tool, whose function
    fields sit at the top level; other tool types are passed as they are."""
    function = tool.get("function")
    if tool.get("type") == "function" and isinstance(function, dict):
        return {"type": "function", **function}
    return tool


def provider_body(body: dict[str, Any], *, provider_model: str, stream: bool) -> dict[str, Any]:
    """The request as the provider should see it."""
    out = {k: v for k, v in body.items() if k not in _EXTENSIONS}
    out["model"] = provider_model
    out["stream"] = stream
    if not stream:
        out.pop("stream_options", None)  # OpenAI refuses stream_options without stream
    return out


def _openai_status_error(
    provider: str, status: int, parsed: Any, text: str, retry_after: float | None
) -> ProviderError:
    error = parsed.get("error") if isinstance(parsed, dict) else None
    message = error.get("message", text) if isinstance(error, dict) else text
    body = {"error": error} if isinstance(error, dict) else None
    return status_error(provider, status, str(message), body=body, retry_after=retry_after)


class OpenAIAdapter(HTTPProviderAdapter):
    def __init__(self, entry: ProviderEntry, api_key: str, *, pool: ConnectionPool | None = None) -> None:
        auth = {"authorization": f"Bearer {api_key}"}
        super().__init__(entry, auth=auth, on_status=_openai_status_error, pool=pool)
        base_url = entry.base_url.rstrip("/")
        self._to = {endpoint: destination(base_url + path) for endpoint, path in _PATHS.items()}
        self._count_to = destination(base_url + "/responses/input_tokens")

    def _request(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str], *, stream: bool
    ) -> tuple[Post, str]:
        logical, provider_model = self._models(body)
        request = build_post(
            self._to[endpoint],
            provider_body(body, provider_model=provider_model, stream=stream),
            auth=self._auth,
            client_headers=headers,
        )
        return request, logical

    async def complete(self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]) -> Completion:
        request, logical = self._request(endpoint, body, headers, stream=False)
        result = typed_completion(self.entry.id, await self._fetch_json(request))
        result.model = logical
        return result

    async def count_tokens(self, body: dict[str, Any], headers: dict[str, str]) -> int:
        """OpenAI's input token count (`POST /responses/input_tokens`): the chat request as a
        Responses request (its messages, tool calls and tool results as input items, its tools
        as Responses function tools): what the model reads, which is what it counts."""
        _, provider_model = self._models(body)
        payload: dict[str, Any] = {"model": provider_model, "input": _input_items(body.get("messages") or [])}
        tools = [_responses_tool(tool) for tool in body.get("tools") or [] if isinstance(tool, dict)]
        if tools:
            payload["tools"] = tools
            choice = body.get("tool_choice")
            if isinstance(choice, str):
                payload["tool_choice"] = choice
            elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
                payload["tool_choice"] = {"type": "function", "name": choice["function"].get("name")}
        return await self._fetch_count(
            build_post(self._count_to, payload, auth=self._auth, client_headers=headers)
        )

    @contextlib.asynccontextmanager
    async def stream(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        request, logical = self._request(endpoint, body, headers, stream=True)
        response = await self._open(request)
        chunks = self._chunks(response, logical)
        try:
            yield chunks
        finally:
            await chunks.aclose()
            self._release(response)

    async def _chunks(self, response: Connection, logical: str) -> AsyncIterator[Chunk]:
        started = time.monotonic()
        events = sse_events(response, provider=self.entry.id, timeouts=self.entry.timeouts)
        try:
            async for event in events:
                if event.data.strip() == "[DONE]":
                    await drain(response, idle_s=self.entry.timeouts.idle_s)
                    return
                chunk = decode_chunk(self.entry.id, event)
                if chunk.error is not UNSET:
                    message = chunk.error.message
                    raise ProviderError(f"{self.entry.id}: error in stream: {message}", kind="server_error")
                chunk.model = logical
                yield chunk
        finally:
            await events.aclose()
        raise ProviderError(
            f"{self.entry.id}: stream ended before [DONE] after {time.monotonic() - started:.1f}s",
            kind="stream_broken",
        )

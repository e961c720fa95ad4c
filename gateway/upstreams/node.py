"""The Upstream for regional nodes: OpenAI-format HTTP/SSE over the app's pooled HTTP/1.1 client.

Every node request carries the gateway's node credential and the tenant's routing headers
(x-meridian-tenant, x-meridian-priority, x-meridian-cache-salt), which the pipeline puts in
`headers`. Failures become UpstreamError: connect errors, timeouts, 5xx and 429 are retryable on
another target; other 4xx are the client's fault and go back to it unchanged. The node's
`Server-Timing` header becomes the answer's (or the stream's first chunk's) `timings` field, the
shape in which its usage chunk already carries the whole breakdown (protocol/timing.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from msgspec import UNSET

from gateway.http import (
    Connection,
    ConnectionPool,
    Response,
    Timeout,
    TransportError,
    split_url,
)
from gateway.upstreams.base import Endpoint, UpstreamError
from protocol.chunk import (
    CACHED_TOKENS_HEADER,
    PROMPT_TOKENS_HEADER,
    Chunk,
    Completion,
    Usage,
    chunk_decoder,
    completion_decoder,
    opened_usage,
)
from protocol.sse import DataLines, LineTooLong
from protocol.timing import parse_server_timing
from protocol.tokenize import TokenizeResponse

_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "tokenize": "/tokenize",
}
# What a count sends the node's /tokenize (vLLM's shape): the conversation and how it is rendered.
_TOKENIZE_FIELDS = ("model", "messages", "add_generation_prompt", "continue_final_message")
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_count_decoder = msgspec.json.Decoder(TokenizeResponse)


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _error_body(content: bytes) -> dict[str, Any] | None:
    try:
        body = _decoder.decode(content)
    except msgspec.DecodeError:
        return None
    return body if isinstance(body, dict) and isinstance(body.get("error"), dict) else None


def status_error(status: int, retry_after: str | None, content: bytes, target: str) -> UpstreamError:
    """Map a node's non-200 answer to an UpstreamError."""
    body = _error_body(content)
    detail = body["error"].get("message") if body else content[:200].decode("utf-8", "replace")
    if status in (401, 403):
        # The node refused the gateway's credential: a deployment fault, never the client's key.
        return UpstreamError(
            f"{target} rejected the gateway's node credential", status_code=502, retryable=True
        )
    # 404: the directory says the node serves the model but the node disagrees; another may not.
    retryable = status >= 500 or status in (404, 408, 429)
    return UpstreamError(
        f"{target} answered HTTP {status}: {detail}",
        status_code=status,
        retryable=retryable,
        body=body if not retryable else None,
        retry_after=_retry_after(retry_after) if status in (429, 503) else None,
    )


def _timings(response: Response | Connection) -> dict[str, float] | None:
    header = response.header(b"server-timing")
    return parse_server_timing(header).to_wire() if header else None


_PROMPT_TOKENS, _CACHED_TOKENS = PROMPT_TOKENS_HEADER.encode(), CACHED_TOKENS_HEADER.encode()


def _opened_usage(response: Connection) -> Usage | None:
    """The prompt the node counted, from its stream's headers (None from a node that does not say)."""
    prompt, cached = response.header(_PROMPT_TOKENS), response.header(_CACHED_TOKENS)
    if prompt is None or not prompt.isdigit():
        return None
    return opened_usage(int(prompt), int(cached) if cached is not None and cached.isdigit() else 0)


def transport_error(exc: TransportError, target: str) -> UpstreamError:
    if isinstance(exc, Timeout):
        return UpstreamError(f"{target} timed out ({type(exc).__name__})", status_code=504)
    return UpstreamError(f"{target} failed: {type(exc).__name__}: {exc}", status_code=502)


async def _sse_chunks(
    response: Connection,
    idle_s: float,
    target: str,
    timings: dict[str, float] | None,
    opened: Usage | None,
) -> AsyncIterator[Chunk]:
    """Typed chunks (protocol/chunk.py) from an SSE body; a body that ends before `[DONE]` is a broken stream.

    Our nodes send one `data:` line per event, so the lean DataLines reader splits them (the hot
    path: every chunk of every stream) rather than the spec-complete SSEDecoder.
    """
    done = False
    first = True
    lines = DataLines()
    while True:
        try:
            data = await response.next_chunk(idle_s)
        except TransportError as exc:
            if done:
                return  # the answer was complete; only the connection's tidy end was lost
            raise transport_error(exc, target) from None
        try:
            payloads = lines.feed(data) if data is not None else lines.end()
        except LineTooLong as exc:
            raise UpstreamError(f"{target} sent a malformed stream: {exc}", status_code=502) from None
        for payload in payloads:
            if done:
                continue  # anything after [DONE]
            if payload == b"[DONE]":
                # Keep reading to the end of the body (normally just the chunked terminator):
                # only a fully read connection goes back to the pool.
                done = True
                continue
            try:
                chunk = chunk_decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise UpstreamError(f"{target} sent a malformed stream event", status_code=502) from None
            if chunk.error is not UNSET:
                message = chunk.error.message
                raise UpstreamError(f"{target} ended the stream with an error: {message}", status_code=502)
            if first:  # what the headers said, on the first
                first = False
                if timings is not None:
                    chunk.timings = timings
                if opened is not None:
                    chunk.opened_usage = opened
            yield chunk
        if data is None:
            break
    if not done:
        raise UpstreamError(f"{target} closed the stream before [DONE]", status_code=502)


class NodeUpstream:
    """One regional node; its connections come from the app's shared ConnectionPool (which also
    holds the connect timeout: one pool serves every node)."""

    token_exact = True

    def __init__(
        self,
        base_url: str,
        pool: ConnectionPool,
        *,
        node_token: str | None,
        read_timeout_s: float,
        stream_idle_s: float,
        name: str | None = None,
    ) -> None:
        self._origin, host, prefix = split_url(base_url)
        self._pool = pool
        self._name = name or base_url.rstrip("/")
        self._read_timeout_s = read_timeout_s
        # For streams the read timeout is the idle timeout: it bounds the wait for each chunk.
        self._stream_idle_s = stream_idle_s
        auth = f"authorization: Bearer {node_token}\r\n" if node_token else ""
        # Everything in a request that does not change between requests, encoded once.
        self._heads = {
            endpoint: (
                f"POST {prefix}{path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n{auth}"
            ).encode()
            for endpoint, path in _PATHS.items()
        }

    def _request(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
        content = _encoder.encode(body)
        lines = []
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}\r\n")
        lines.append(f"content-length: {len(content)}\r\n\r\n")
        return self._heads[path] + "".join(lines).encode() + content

    async def _exchange(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        """A whole JSON exchange with the node: its 200 response, or the UpstreamError."""
        raw = self._request(path, body, headers)
        try:
            response = await self._pool.request(self._origin, raw, timeout_s=self._read_timeout_s)
        except TransportError as exc:
            raise transport_error(exc, self._name) from None
        if response.status != 200:
            raise status_error(response.status, response.header(b"retry-after"), response.body, self._name)
        return response

    async def complete(self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]) -> Completion:
        response = await self._exchange(endpoint, {**body, "stream": False}, headers)
        try:
            result = completion_decoder.decode(response.body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise UpstreamError(f"{self._name} sent a malformed response", status_code=502) from None
        if (timings := _timings(response)) is not None:
            result.timings = timings
        return result

    async def count_tokens(self, body: dict[str, Any], headers: dict[str, str]) -> int:
        asked = {name: body[name] for name in _TOKENIZE_FIELDS if name in body}
        response = await self._exchange("tokenize", asked, headers)
        try:
            return _count_decoder.decode(response.body).count
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise UpstreamError(f"{self._name} sent a malformed token count", status_code=502) from None

    @contextlib.asynccontextmanager
    async def stream(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[Chunk]]:
        raw = self._request(endpoint, {**body, "stream": True}, headers)
        idle_s = self._stream_idle_s
        try:
            response = await self._pool.open(self._origin, raw, timeout_s=idle_s)
        except TransportError as exc:
            raise transport_error(exc, self._name) from None
        try:
            if response.status != 200:
                try:
                    content = await response.read_body(idle_s)
                except TransportError as exc:
                    raise transport_error(exc, self._name) from None
                raise status_error(response.status, response.header(b"retry-after"), content, self._name)
            chunks = _sse_chunks(response, idle_s, self._name, _timings(response), _opened_usage(response))
            try:
                yield chunks
            finally:
                await chunks.aclose()
        finally:
            # Released before the body's end, the connection is closed: that is how the node
            # learns the client is gone, aborts the sequence and frees its KV blocks.
            self._pool.release(response)

    async def aclose(self) -> None:
        # The shared pool belongs to the app, which closes it once for every node.
        return None

"""The Upstream for regional nodes: OpenAI-format HTTP/SSE over pooled httpx clients.

Every node request carries the gateway's node credential and the tenant's routing headers
(x-meridian-tenant, x-meridian-priority, x-meridian-cache-salt), which the pipeline puts in
`headers`. Failures become UpstreamError: connect errors, timeouts, 5xx and 429 are retryable on
another target; other 4xx are the client's fault and go back to it unchanged.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec

from gateway.upstreams.base import Endpoint, UpstreamError

_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
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


def status_error(response: httpx.Response, content: bytes, target: str) -> UpstreamError:
    """Map a node's non-200 answer to an UpstreamError."""
    status = response.status_code
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
        retry_after=_retry_after(response) if status == 429 else None,
    )


def transport_error(exc: httpx.HTTPError, target: str) -> UpstreamError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError(f"{target} timed out ({type(exc).__name__})", status_code=504)
    return UpstreamError(f"{target} failed: {type(exc).__name__}: {exc}", status_code=502)


async def _sse_chunks(response: httpx.Response, target: str) -> AsyncIterator[dict[str, Any]]:
    """OpenAI chunk dicts from an SSE body; a body that ends before `[DONE]` is a broken stream.

    Deliberately leaner than gateway/providers/sse.py's spec-complete decoder: our nodes send one
    `data:` line per event, and this loop runs for every chunk of every stream (the hot path).
    """
    done = False
    try:
        async for line in response.aiter_lines():
            if done or not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines; anything after [DONE]
            data = line[5:].strip()
            if data == "[DONE]":
                # Keep reading to the end of the body (normally just the chunked terminator):
                # httpx only returns a fully read connection to the pool for reuse.
                done = True
                continue
            try:
                chunk = _decoder.decode(data)
            except msgspec.DecodeError:
                raise UpstreamError(f"{target} sent a malformed stream event", status_code=502) from None
            if isinstance(chunk, dict) and "error" in chunk:
                message = (chunk["error"] or {}).get("message", "stream error")
                raise UpstreamError(f"{target} ended the stream with an error: {message}", status_code=502)
            yield chunk
    except httpx.HTTPError as exc:
        if done:
            return  # the answer was complete; only the connection's tidy end was lost
        raise transport_error(exc, target) from None
    if not done:
        raise UpstreamError(f"{target} closed the stream before [DONE]", status_code=502)


class ClientPool:
    """httpx clients shared by every node upstream, taken in turn; owned by the app.

    Several small pools instead of one big one: httpcore re-counts every connection for each
    connection it checks when assigning a request (O(connections^2) per request), which made a
    single client the gateway's bottleneck at ~30 concurrent requests.
    """

    def __init__(self, size: int, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        assert size >= 1, "a client pool needs at least one client"
        self._clients = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=32, keepalive_expiry=30.0),
            )
            for _ in range(size)
        ]
        self._turn = itertools.cycle(self._clients)

    def next(self) -> httpx.AsyncClient:
        return next(self._turn)

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


class NodeUpstream:
    """One regional node; its connections come from the app's shared ClientPool."""

    token_exact = True

    def __init__(
        self,
        base_url: str,
        clients: ClientPool,
        *,
        node_token: str | None,
        read_timeout_s: float,
        stream_idle_s: float,
        connect_timeout_s: float,
        name: str | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._clients = clients
        self._auth = {"authorization": f"Bearer {node_token}"} if node_token else {}
        self._name = name or self._base_url
        self._complete_timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        # For streams the read timeout is the idle timeout: it bounds the wait for each chunk.
        self._stream_timeout = httpx.Timeout(stream_idle_s, connect=connect_timeout_s)

    def _request(
        self, client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> httpx.Request:
        return client.build_request(
            "POST",
            self._base_url + _PATHS[endpoint],
            content=_encoder.encode(body),
            headers={**headers, **self._auth, "content-type": "application/json"},
        )

    async def complete(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        client = self._clients.next()
        request = self._request(client, endpoint, {**body, "stream": False}, headers)
        request.extensions["timeout"] = self._complete_timeout.as_dict()
        try:
            response = await client.send(request)
        except httpx.HTTPError as exc:
            raise transport_error(exc, self._name) from None
        if response.status_code != 200:
            raise status_error(response, response.content, self._name)
        try:
            result = _decoder.decode(response.content)
        except msgspec.DecodeError:
            raise UpstreamError(f"{self._name} sent a malformed response", status_code=502) from None
        if not isinstance(result, dict):
            raise UpstreamError(f"{self._name} sent a malformed response", status_code=502)
        return result

    @contextlib.asynccontextmanager
    async def stream(
        self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        client = self._clients.next()
        request = self._request(client, endpoint, {**body, "stream": True}, headers)
        request.extensions["timeout"] = self._stream_timeout.as_dict()
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise transport_error(exc, self._name) from None
        try:
            if response.status_code != 200:
                try:
                    content = await response.aread()
                except httpx.HTTPError as exc:
                    raise transport_error(exc, self._name) from None
                raise status_error(response, content, self._name)
            chunks = _sse_chunks(response, self._name)
            try:
                yield chunks
            finally:
                await chunks.aclose()
        finally:
            # Closing the connection mid-stream is how the node learns the client is gone: it
            # aborts the sequence and frees its KV blocks.
            await response.aclose()

    async def aclose(self) -> None:
        # The shared clients belong to the app, which closes them once for every node.
        return None

"""HTTP plumbing both adapters share: one pooled client per provider and the three timeouts.

- connect: httpx's connect timeout.
- first byte: from sending the request until the response headers arrive (asyncio.timeout
  around `send`); for a non-streamed answer that is most of the generation.
- idle: the longest silence while reading the body or between two stream lines (httpx's read
  timeout, plus asyncio.timeout around each line so a server trickling bytes without ever
  finishing a line is caught too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec

from gateway.upstreams.providers.config import ProviderTimeouts
from gateway.upstreams.providers.errors import ProviderError, parse_retry_after
from protocol.sse import SSEDecoder, SSEEvent

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
# Headers of the client's request worth passing on: tracing only. Never the gateway's own.
_FORWARDED_HEADERS = ("x-request-id",)

# (provider, status, parsed body or None, raw text, retry_after) -> the error to raise
StatusMapper = Callable[[str, int, Any, str, float | None], ProviderError]


def build_client(timeouts: ProviderTimeouts) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeouts.idle_s, connect=timeouts.connect_s),
        limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
    )


def build_post(
    client: httpx.AsyncClient, url: str, payload: Any, *, auth: dict[str, str], client_headers: dict[str, str]
) -> httpx.Request:
    """A JSON POST of `payload` to the provider, with its auth and the client's tracing headers."""
    forwarded = {k: v for k in _FORWARDED_HEADERS if (v := client_headers.get(k)) is not None}
    return client.build_request(
        "POST",
        url,
        content=_encoder.encode(payload),
        headers={**forwarded, **auth, "content-type": "application/json"},
    )


def transport_error(provider: str, exc: httpx.HTTPError) -> ProviderError:
    if isinstance(exc, httpx.ConnectTimeout):
        return ProviderError(f"{provider}: connect timed out", kind="connect", status_code=504)
    if isinstance(exc, httpx.TimeoutException):
        return ProviderError(f"{provider}: timed out ({type(exc).__name__})", kind="timeout", status_code=504)
    if isinstance(exc, httpx.ConnectError):
        return ProviderError(f"{provider}: cannot connect: {exc}", kind="connect")
    return ProviderError(f"{provider}: {type(exc).__name__}: {exc}", kind="stream_broken")


async def open_response(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    provider: str,
    timeouts: ProviderTimeouts,
    on_status: StatusMapper,
) -> httpx.Response:
    """Send and wait for a 2xx response's headers; the body is left to read. Errors are mapped
    by `on_status` (each provider has its own error format)."""
    try:
        async with asyncio.timeout(timeouts.first_byte_s):
            response = await client.send(request, stream=True)
    except TimeoutError:
        raise ProviderError(
            f"{provider}: no response within {timeouts.first_byte_s}s", kind="timeout", status_code=504
        ) from None
    except httpx.HTTPError as exc:
        raise transport_error(provider, exc) from None
    if response.is_success:
        return response
    try:
        content = await read_body(response, provider=provider)
    finally:
        await response.aclose()
    text = content[:2000].decode("utf-8", "replace")
    try:
        parsed = _decoder.decode(content)
    except msgspec.DecodeError:
        parsed = None
    raise on_status(provider, response.status_code, parsed, text, parse_retry_after(response.headers))


async def read_body(response: httpx.Response, *, provider: str) -> bytes:
    """The whole body; httpx's read timeout (the idle timeout) bounds each read."""
    try:
        return await response.aread()
    except httpx.HTTPError as exc:
        raise transport_error(provider, exc) from None


async def read_json(response: httpx.Response, *, provider: str) -> dict[str, Any]:
    content = await read_body(response, provider=provider)
    try:
        result = _decoder.decode(content)
    except msgspec.DecodeError:
        raise ProviderError(f"{provider}: response is not JSON", kind="bad_response") from None
    if not isinstance(result, dict):
        raise ProviderError(f"{provider}: response is not a JSON object", kind="bad_response")
    return result


async def sse_events(
    response: httpx.Response, *, provider: str, timeouts: ProviderTimeouts
) -> AsyncIterator[SSEEvent]:
    """The events of an SSE body. Ends quietly at the end of the body: whether that was too early
    is the caller's call (it knows which event should have come last)."""
    decoder = SSEDecoder()
    lines = response.aiter_lines()
    try:
        while True:
            try:
                async with asyncio.timeout(timeouts.idle_s):
                    line = await anext(lines)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise ProviderError(
                    f"{provider}: stream idle for more than {timeouts.idle_s}s",
                    kind="timeout",
                    status_code=504,
                ) from None
            except httpx.HTTPError as exc:
                raise transport_error(provider, exc) from None
            event = decoder.feed(line)
            if event is not None:
                yield event
        last = decoder.end()
        if last is not None:
            yield last
    finally:
        await lines.aclose()


def decode_event(provider: str, event: SSEEvent) -> dict[str, Any]:
    try:
        data = _decoder.decode(event.data)
    except msgspec.DecodeError:
        raise ProviderError(f"{provider}: malformed stream event", kind="bad_response") from None
    if not isinstance(data, dict):
        raise ProviderError(f"{provider}: stream event is not a JSON object", kind="bad_response")
    return data

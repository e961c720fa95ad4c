"""A lean pooled HTTP/1.1 client for node and provider traffic: asyncio protocol + httptools' parser.

Why not httpx: a request through httpx/httpcore costs the gateway about as much CPU as everything
else it does per request (its profile is mostly httpcore's connection-pool bookkeeping, h11 and
the anyio stream layers), and httpcore does not survive the keep-alive race (below). Nodes and
providers speak one dialect — HTTP/1.1, `Content-Length` JSON or chunked SSE, over TCP or TLS —
so this client does only that: one `asyncio.Protocol` per connection feeding llhttp (through
httptools), which de-chunks the body and says whether the connection may be kept.

Rules the callers rely on:
- Connections are pooled per origin (scheme, host, port), newest idle first, at most
  `max_connections` open per origin (more requests wait, up to the connect timeout) and at most
  `max_idle` kept idle; an idle one is dropped as soon as the server closes it, and never reused
  once it may be near the server's own idle timeout: after `idle_expiry_s`, or sooner when the
  response said `Keep-Alive: timeout=N` (then safely before N, whatever N the server runs with).
  Idle time counts from when the response ended, not from when the caller finished reading it.
- A connection goes back to the pool only if its response was read to the end and both sides
  allow keep-alive. Releasing a stream's connection early closes it: that is how a node learns
  its client went away and frees the sequence's KV blocks.
- A request sent on a reused connection that the server closed before answering a single byte is
  sent once more, on a new connection: the server closed it as idle just as we reused it (the
  keep-alive race), so it never saw the request. The caller never sees that first attempt, so it
  is never held against the server.
- Every wait is bounded: connecting by the connect timeout, each wait for response bytes by the
  read timeout (for a stream, the idle time allowed between two chunks).
- https verifies the server's certificate and host name (SNI set) against the system's CA store
  and certifi's bundle (`default_ssl_context`).
"""

from gateway.http.connection import (
    Connection,
    Headers,
    Origin,
    Response,
    idle_expiry,
    keep_alive_timeout,
    split_url,
)
from gateway.http.errors import (
    ConnectError,
    ConnectTimeout,
    PoolTimeout,
    ReadError,
    ReadTimeout,
    RemoteProtocolError,
    Timeout,
    TransportError,
)
from gateway.http.pool import ConnectionPool, default_ssl_context

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "Connection",
    "ConnectionPool",
    "Headers",
    "Origin",
    "PoolTimeout",
    "ReadError",
    "ReadTimeout",
    "RemoteProtocolError",
    "Response",
    "Timeout",
    "TransportError",
    "default_ssl_context",
    "idle_expiry",
    "keep_alive_timeout",
    "split_url",
]

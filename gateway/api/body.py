"""The front doors' request body: read within the gateway's `server` limits (size, time)."""

from __future__ import annotations

from typing import Any

from litestar import Request

from http_server import read_body


async def request_body(request: Request[Any, Any, Any]) -> bytes:
    """The body, or PayloadTooLargeError / RequestTimeoutError / ClientDisconnected (see read_body)."""
    return await read_body(request.receive, request.headers, request.app.state["gateway"].config.server)

"""The floor under a gateway on Meridian's stack: what the server, the framework and one upstream
exchange cost with nothing of a gateway's own work between them (`--floor`).

    python -m gateway_bench.floor {litestar,asgi} --port P --upstream URL

Both serve `POST /v1/chat/completions` (streamed or not) by sending the request's body unchanged to
the upstream on the gateway's own HTTP client (gateway/http) and relaying the answer's bytes as
they come; no key, policy, admission, quota, routing, safety, metrics or ledger:
  floor_litestar  the gateway's server (uvicorn through http_server, uvloop, the same limits) and
                  Litestar, a handler with the request as a parameter, as the gateway's doors are;
  floor_asgi      the same server and a bare ASGI callable: no framework at all.
Meridian's own cost per request is its measurement minus floor_litestar's; the ratio to LiteLLM
that a gateway on this stack could reach at best is LiteLLM's over floor_litestar's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Request, post
from litestar.response import Response, Stream

from gateway.http import Connection, ConnectionPool, split_url
from http_server.limits import ServerLimits
from http_server.server import server_config

_PATH = "/v1/chat/completions"
_TIMEOUT_S = 30.0


class _Upstream:
    def __init__(self, url: str) -> None:
        self.origin, self.host, prefix = split_url(url)
        self.path = f"{prefix}{_PATH}"
        self.pool = ConnectionPool(connect_timeout_s=5.0)

    async def open(self, body: bytes) -> Connection:
        head = (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        connection = await self.pool.open(self.origin, head + body, timeout_s=_TIMEOUT_S)
        await connection.wait_headers(_TIMEOUT_S)
        return connection

    async def chunks(self, connection: Connection) -> AsyncIterator[bytes]:
        try:
            while (chunk := await connection.next_chunk(_TIMEOUT_S)) is not None:
                yield chunk
        finally:
            self.pool.release(connection)

    async def whole(self, connection: Connection) -> bytes:
        try:
            return await connection.read_body(_TIMEOUT_S)
        finally:
            self.pool.release(connection)


def _streamed(connection: Connection) -> bool:
    return (connection.header(b"content-type") or "").startswith("text/event-stream")


def litestar_app(upstream: _Upstream) -> Litestar:
    @post(_PATH, status_code=200)
    async def chat(request: Request[Any, Any, Any]) -> Response[bytes] | Stream:
        connection = await upstream.open(await request.body())
        if _streamed(connection):
            return Stream(upstream.chunks(connection), media_type="text/event-stream")
        return Response(await upstream.whole(connection), media_type="application/json")

    return Litestar([chat], openapi_config=None)


def asgi_app(upstream: _Upstream) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        connection = await upstream.open(body)
        streamed = _streamed(connection)
        kind = b"text/event-stream" if streamed else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        if streamed:
            async for chunk in upstream.chunks(connection):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": await upstream.whole(connection)})

    return app


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("litestar", "asgi"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args(argv)
    import uvicorn

    upstream = _Upstream(args.upstream)
    app = litestar_app(upstream) if args.kind == "litestar" else asgi_app(upstream)
    config = server_config(app, "127.0.0.1", args.port, ServerLimits(), log_level="warning", access_log=False)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

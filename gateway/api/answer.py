"""How the doors answer: a body encoded once, its head built from the call's headers.

`Answer` is an ASGI app a handler returns as is (handlers are annotated `ASGIApp`, so Litestar
passes it through). Litestar's `Response` would merge the call's headers with its layers' and
cookies, render the body through its encoder hooks and build the head anew for every answer: on
the generation doors that was about a tenth of the gateway's own CPU per request (the c=32
benchmark: 0.59 against 0.55 ms). Streams are SSE responses (sse.py) and errors stay Litestar
responses (doors.py): an exception handler must return one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from litestar.types import Receive, Scope, Send

_encoder = msgspec.json.Encoder()


class Answer:
    """`body` with `headers` (the call's: lower-case names, header-safe values), `media_type`
    and `status`."""

    __slots__ = ("_body", "_start")

    def __init__(
        self,
        body: bytes,
        headers: Mapping[str, str],
        *,
        media_type: str = "application/json",
        status: int = 200,
    ) -> None:
        self._body = body
        head = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        head += [(b"content-type", media_type.encode("latin-1")), (b"content-length", b"%d" % len(body))]
        self._start = {"type": "http.response.start", "status": status, "headers": head}

    @classmethod
    def json(cls, value: Any, headers: Mapping[str, str], *, status: int = 200) -> Answer:
        """`value` (a struct, dict or list) as JSON."""
        return cls(_encoder.encode(value), headers, status=status)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(self._start)  # type: ignore[arg-type]
        await send({"type": "http.response.body", "body": self._body, "more_body": False})

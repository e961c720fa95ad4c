"""The limits a serving process enforces on its clients (`server:` in the gateway's and a node's
config). They apply per process: `meridian gateway --workers N` allows N times the connections."""

from __future__ import annotations

from typing import Annotated

import msgspec

Seconds = Annotated[float, msgspec.Meta(gt=0)]
# Whole seconds: what uvicorn takes and what `Keep-Alive: timeout=N` can say.
KeepAliveSeconds = Annotated[int, msgspec.Meta(ge=1, le=3600)]

# How long past a read deadline the server waits before its verdict: any timer, however short,
# makes the event loop poll its sockets first (uvloop runs due timers before reading; a loop that
# ran late would otherwise judge a client whose bytes sit unread in the socket).
LAST_LOOK_S = 0.001


class ServerLimits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    # Open connections at once; one more is answered 503 (Retry-After: 1) and closed at once.
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 2048
    # From a connection's opening (or a kept-alive connection's next request's first byte) to the
    # end of the request's headers; a client slower than that gets 408 and is disconnected.
    # Both read timeouts measure the client, not the server: the verdict is given only after the
    # server has looked at the socket once more (LAST_LOOK_S), so a process that was too busy or
    # starved to read in time never refuses what already arrived.
    header_timeout_s: Seconds = 10.0
    # From the end of the headers to the end of the body; slower gets 408 and is disconnected.
    body_timeout_s: Seconds = 30.0
    # Request line plus headers; more is refused with 431.
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024
    # A larger body is refused with 413: from its Content-Length before any of it is read, or as
    # soon as a chunked body passes the limit.
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 10 * 1024 * 1024
    # How long an idle kept-alive connection stays open. Every response says so
    # (`Keep-Alive: timeout=N`), so clients that honour it (the gateway's own client towards
    # nodes does) let an idle connection go before the server closes it.
    keep_alive_s: KeepAliveSeconds = 5

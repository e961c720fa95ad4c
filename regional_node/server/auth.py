"""Bearer-token check for node calls: only the gateway (which holds the token) may use a node.

A Litestar guard on every route; handlers marked `opt={"public": True}` (/health) skip it so
orchestrators can probe liveness without the secret.
"""

from __future__ import annotations

import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from protocol import AuthenticationError

PUBLIC = {"public": True}


def bearer_guard(token: str) -> Guard:
    """A guard that accepts only `Authorization: Bearer <token>`, compared in constant time."""
    expected = token.encode()

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if handler.opt.get("public"):
            return
        header = connection.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if not header:
            raise AuthenticationError(
                "Missing bearer token: send `Authorization: Bearer <node token>`.", code="missing_api_key"
            )
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected):
            raise AuthenticationError("Incorrect node token provided.")

    return guard

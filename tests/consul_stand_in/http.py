"""The stand-in's HTTP side: one agent's listener, Consul's routes, ACLs and blocking queries.

A deliberately tiny HTTP/1.1 server on asyncio streams (Content-Length bodies, keep-alive), so a
stop can cut every open connection at once, the way a killed Consul agent does, which is what
outage tests need and what a framework's graceful shutdown would hide.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.consul_stand_in.catalog import ConsulAPIError, Datacenter, parse_duration

# Consul's blocking-query limits (agent/consul/rpc.go): default wait 5 m, max 10 m, jitter wait/16.
DEFAULT_WAIT_S = 300.0
MAX_WAIT_S = 600.0
JITTER_FRACTION = 16
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    500: "Internal Server Error",
}


@dataclass
class Federation:
    """WAN-federated datacenters, shared by every agent so `?dc=` reaches any of them."""

    datacenters: dict[str, Datacenter]
    acl_token: str | None = None  # when set: ACLs on, default policy deny
    changed: dict[str, asyncio.Event] = field(default_factory=dict)

    def event(self, dc: str) -> asyncio.Event:
        return self.changed.setdefault(dc, asyncio.Event())

    def notify(self, dc: str) -> None:
        # Wake every blocked query on this dc; each re-checks its own index.
        self.changed.pop(dc, asyncio.Event()).set()


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    def token(self) -> str:
        # Consul reads X-Consul-Token, then "Authorization: Bearer", then ?token= (agent/http.go parseToken).
        if self.headers.get("x-consul-token"):
            return self.headers["x-consul-token"]
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return self.param("token") or ""


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class AgentServer:
    """One Consul agent (in datacenter `dc`) listening on 127.0.0.1:`port`."""

    def __init__(self, federation: Federation, dc: str, port: int, clock: Any) -> None:
        self.federation = federation
        self.dc = dc
        self.port = port
        self._clock = clock
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                response = await self._dispatch(request)
                writer.write(_encode(response))
                await writer.drain()
                if request.headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            # abort, not close: a stopped agent resets its connections, it does not answer them.
            writer.transport.abort()
            self._connections.discard(task)

    async def _dispatch(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except ConsulAPIError as exc:
            return Response(exc.status, exc.message.encode(), {"Content-Type": "text/plain; charset=utf-8"})

    async def _route(self, request: Request) -> Response:
        path, method = request.path, request.method
        routes = (
            ("/v1/agent/service/register", "PUT", self._register),
            ("/v1/agent/service/deregister/", "PUT", self._deregister),
            ("/v1/agent/check/pass/", "PUT", self._check_update),
            ("/v1/agent/check/warn/", "PUT", self._check_update),
            ("/v1/agent/check/fail/", "PUT", self._check_update),
            ("/v1/health/service/", "GET", self._health_service),
            ("/v1/status/leader", "GET", self._leader),
        )
        for prefix, allowed, handler in routes:
            if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
                if method != allowed:
                    raise ConsulAPIError(405, f"method {method} not allowed")
                return await handler(request)
        raise ConsulAPIError(404, "404 page not found")

    def _authorize_write(self, request: Request, what: str) -> None:
        """With ACLs on: an unknown token is "ACL not found"; no token is the anonymous token,
        which the default-deny policy refuses writes (agent/acl.go, acl.PermissionDeniedError)."""
        expected = self.federation.acl_token
        if expected is None:
            return
        token = request.token()
        if token and token != expected:
            raise ConsulAPIError(403, "ACL not found")
        if not token:
            raise ConsulAPIError(403, f"Permission denied: anonymous token lacks permission '{what}'")

    def _authorize_read(self, request: Request) -> bool:
        """True when results must be hidden: reads by the anonymous token are filtered, not
        refused (X-Consul-Results-Filtered-By-ACLs); an unknown token is still refused."""
        expected = self.federation.acl_token
        if expected is None:
            return False
        token = request.token()
        if token and token != expected:
            raise ConsulAPIError(403, "ACL not found")
        return not token

    def _local(self) -> Datacenter:
        return self.federation.datacenters[self.dc]

    async def _register(self, request: Request) -> Response:
        try:
            body = json.loads(request.body or b"{}")
        except json.JSONDecodeError as exc:
            raise ConsulAPIError(400, f"Request decode failed: {exc}") from exc
        if not isinstance(body, dict):
            raise ConsulAPIError(400, "Request decode failed: body must be a JSON object")
        self._authorize_write(request, f'service:write on "{body.get("Name", "")}"')
        self._local().register(body, self._clock())
        self.federation.notify(self.dc)
        return Response()

    async def _deregister(self, request: Request) -> Response:
        service_id = unquote(request.path.removeprefix("/v1/agent/service/deregister/"))
        self._authorize_write(request, "service:write")
        self._local().deregister(service_id)
        self.federation.notify(self.dc)
        return Response()

    async def _check_update(self, request: Request) -> Response:
        verb, _, check_id = request.path.removeprefix("/v1/agent/check/").partition("/")
        status = {"pass": "passing", "warn": "warning", "fail": "critical"}[verb]
        self._authorize_write(request, "service:write")
        self._local().update_ttl(unquote(check_id), status, request.param("note") or "", self._clock())
        self.federation.notify(self.dc)
        return Response()

    async def _leader(self, _: Request) -> Response:
        return Response(200, b'"127.0.0.1:8300"', {"Content-Type": "application/json"})

    async def _health_service(self, request: Request) -> Response:
        name = unquote(request.path.removeprefix("/v1/health/service/"))
        dc_name = request.param("dc") or self.dc
        dc = self.federation.datacenters.get(dc_name)
        if dc is None:
            raise ConsulAPIError(500, "No path to datacenter")
        filtered = self._authorize_read(request)
        min_index, wait_s = _blocking_params(request)
        passing = "passing" in request.query and request.param("passing") not in ("false", "0")
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            event = self.federation.event(dc_name)
            index = dc.query_index(name)
            remaining = deadline - asyncio.get_running_loop().time()
            # Block while nothing is newer than the caller's index (rpc.go blockingQuery).
            if min_index == 0 or index > min_index or remaining <= 0:
                break
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                pass
        headers = {
            "Content-Type": "application/json",
            "X-Consul-Index": str(index),
            "X-Consul-Knownleader": "true",
            "X-Consul-Lastcontact": "0",
            "X-Consul-Effective-Consistency": "leader",
        }
        entries = [] if filtered else dc.health_service(name, passing)
        if filtered:
            headers["X-Consul-Results-Filtered-By-ACLs"] = "true"
        return Response(200, json.dumps(entries).encode(), headers)


def _blocking_params(request: Request) -> tuple[int, float]:
    raw_index, raw_wait = request.param("index"), request.param("wait")
    try:
        min_index = int(raw_index) if raw_index else 0
    except ValueError as exc:
        raise ConsulAPIError(400, "Invalid index") from exc
    try:
        wait_s = parse_duration(raw_wait) if raw_wait else DEFAULT_WAIT_S
    except ValueError as exc:
        raise ConsulAPIError(400, "Invalid wait time") from exc
    wait_s = min(wait_s or DEFAULT_WAIT_S, MAX_WAIT_S)
    return min_index, wait_s + random.uniform(0, wait_s / JITTER_FRACTION)


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    url = urlsplit(target)
    return Request(method, url.path, parse_qs(url.query, keep_blank_values=True), headers, body)


def _encode(response: Response) -> bytes:
    headers = {"Content-Length": str(len(response.body)), **response.headers}
    head = f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
    head += "".join(f"{key}: {value}\r\n" for key, value in headers.items())
    return head.encode("latin-1") + b"\r\n" + response.body

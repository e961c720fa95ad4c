"""A small async client for the handful of Consul HTTP API endpoints Meridian uses.

Register/deregister a service and update its TTL check (regional nodes), watch a service's
passing instances with blocking queries (the gateway), and ask for the leader (liveness).
Every call has a timeout; a blocking read's timeout is its wait plus Consul's jitter plus a
margin, so a slow-but-alive Consul is never mistaken for a dead one.
See gateway/discovery/README.md for why this is not python-consul/py-consul.
"""

from __future__ import annotations

import os
import random
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import httpx
import msgspec

from protocol.consul.wire import ServiceEntry, ServiceRegistration, go_duration

TTLStatus = Literal["pass", "warn", "fail"]

# Consul adds up to wait/16 to a blocking query's wait (agent/consul/rpc.go, JitterFraction).
CONSUL_JITTER_FRACTION = 16
# Consul caps a blocking query's wait at 10 minutes.
MAX_WAIT_S = 600.0


class ConsulTLS(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ca_file: str | None = None  # CA bundle that signed Consul's server certificate
    cert_file: str | None = None  # client certificate, when Consul has verify_incoming on
    key_file: str | None = None
    verify: bool = True  # false only for development: skips server certificate checks


class ConsulConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How to reach a Consul agent; the `consul:` section of gateway and node configs."""

    address: str = "127.0.0.1:8500"  # host:port, or a URL (its scheme then wins)
    scheme: Literal["http", "https"] = "http"
    token: str | None = None  # ACL token; prefer token_env so secrets stay out of YAML
    token_env: str = "CONSUL_HTTP_TOKEN"  # environment variable read when `token` is unset
    datacenters: tuple[str, ...] = ()  # empty: the agent's own datacenter
    tls: ConsulTLS = ConsulTLS()
    wait_s: float = 30.0  # blocking query wait (Consul caps it at 600)
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 5.0  # non-blocking calls; also the margin added to blocking reads

    def base_url(self) -> str:
        if "://" in self.address:
            return self.address.rstrip("/")
        return f"{self.scheme}://{self.address}"

    def resolved_token(self) -> str | None:
        return self.token or os.environ.get(self.token_env) or None


class ConsulError(Exception):
    """A Consul call failed."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ConsulUnavailable(ConsulError):
    """Consul could not be reached, timed out, or answered 5xx: worth retrying later."""


class ConsulPermissionDenied(ConsulError):
    """403: the ACL token is missing, unknown ("ACL not found") or lacks a permission."""


class ConsulNotFound(ConsulError):
    """404: e.g. an unknown service or check ID (the agent restarted or reaped it)."""


class ConsulRequestRejected(ConsulError):
    """Another 4xx: Consul rejected the request as malformed (a bug or a bad config)."""


@dataclass(frozen=True)
class HealthResult:
    """One answer of GET /v1/health/service/:service."""

    entries: tuple[ServiceEntry, ...]
    index: int  # X-Consul-Index
    filtered_by_acls: bool  # X-Consul-Results-Filtered-By-ACLs: the token hid some results


def next_blocking_index(previous: int, returned: int) -> int:
    """The index for the next blocking query, per Consul's "blocking queries" guidance.

    An index lower than the one we had means Consul's state went backwards (a snapshot restore,
    an agent restarted without its data): start over from 0. An index below 1 is a Consul bug that
    would turn the loop into a busy loop; 1 is always safe to wait on.
    """
    if returned < previous:
        return 0
    return max(returned, 1)


def blocking_wait(wait_s: float, rng: random.Random | None = None) -> float:
    """The wait to ask for: at most 10 minutes, plus up to 1/16 jitter so many gateways'
    queries do not wake and re-query in lockstep (the spread Consul applies server-side)."""
    wait_s = min(max(wait_s, 0.0), MAX_WAIT_S)
    jitter = (rng or random).uniform(0.0, wait_s / CONSUL_JITTER_FRACTION)
    return min(wait_s + jitter, MAX_WAIT_S)


def resolve_tls_paths(tls: ConsulTLS, base_dir: Path | None) -> ConsulTLS:
    """TLS file paths made absolute against `base_dir` (a config file's folder)."""
    if base_dir is None:
        return tls

    def resolve(path: str | None) -> str | None:
        return None if path is None else str(base_dir / path) if not Path(path).is_absolute() else path

    return msgspec.structs.replace(
        tls, ca_file=resolve(tls.ca_file), cert_file=resolve(tls.cert_file), key_file=resolve(tls.key_file)
    )


def _ssl_context(tls: ConsulTLS) -> ssl.SSLContext | bool:
    if not tls.verify:
        return False
    if tls.ca_file is None and tls.cert_file is None:
        return True
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


class ConsulClient:
    """Async client for one Consul agent. Open once, share, `aclose()` on shutdown."""

    def __init__(self, config: ConsulConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._config = config
        headers = {"Accept": "application/json"}
        token = config.resolved_token()
        if token:
            headers["X-Consul-Token"] = token
        self._http = httpx.AsyncClient(
            base_url=config.base_url(),
            headers=headers,
            verify=_ssl_context(config.tls),
            timeout=self._timeout(config.request_timeout_s),
            transport=transport,
            # A local agent must not be sent through an HTTP proxy picked up from the environment.
            trust_env=False,
        )

    @property
    def config(self) -> ConsulConfig:
        return self._config

    def _timeout(self, read_s: float) -> httpx.Timeout:
        c = self._config
        return httpx.Timeout(read_s, connect=c.connect_timeout_s, pool=c.connect_timeout_s)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ConsulClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def register_service(self, registration: ServiceRegistration) -> None:
        await self._request("PUT", "/v1/agent/service/register", content=msgspec.json.encode(registration))

    async def deregister_service(self, service_id: str) -> None:
        await self._request("PUT", f"/v1/agent/service/deregister/{quote(service_id, safe='')}")

    async def update_ttl(self, check_id: str, status: TTLStatus, note: str = "") -> None:
        params = {"note": note} if note else None
        await self._request("PUT", f"/v1/agent/check/{status}/{quote(check_id, safe='')}", params=params)

    async def leader(self) -> str:
        """The Raft leader's address, or "" while there is none."""
        response = await self._request("GET", "/v1/status/leader")
        return msgspec.json.decode(response.content, type=str)

    async def health_service(
        self,
        service: str,
        *,
        datacenter: str | None = None,
        passing: bool = True,
        index: int = 0,
        wait_s: float | None = None,
    ) -> HealthResult:
        """Instances of `service`; with `index` > 0, a blocking query that returns when the
        result changes past `index` or after about `wait_s` (the config's wait by default)."""
        params: dict[str, str] = {}
        if passing:
            params["passing"] = ""
        if datacenter:
            params["dc"] = datacenter
        read_s = self._config.request_timeout_s
        if index > 0:
            wait = blocking_wait(self._config.wait_s if wait_s is None else wait_s)
            params["index"] = str(index)
            params["wait"] = go_duration(wait)
            # Consul may hold the request for wait + wait/16 before answering.
            read_s += wait * (1 + 1 / CONSUL_JITTER_FRACTION)
        response = await self._request(
            "GET", f"/v1/health/service/{quote(service, safe='')}", params=params, read_s=read_s
        )
        try:
            entries = msgspec.json.decode(response.content, type=list[ServiceEntry] | None) or []
            returned = int(response.headers.get("X-Consul-Index", "0"))
        except (msgspec.DecodeError, ValueError) as exc:
            raise ConsulUnavailable(f"unreadable health answer from Consul: {exc}") from exc
        return HealthResult(
            entries=tuple(entries),
            index=returned,
            filtered_by_acls=response.headers.get("X-Consul-Results-Filtered-By-ACLs") == "true",
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        content: bytes | None = None,
        read_s: float | None = None,
    ) -> httpx.Response:
        timeout = self._timeout(read_s) if read_s is not None else httpx.USE_CLIENT_DEFAULT
        try:
            response = await self._http.request(method, path, params=params, content=content, timeout=timeout)
        except httpx.TransportError as exc:
            raise ConsulUnavailable(f"Consul {method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code < 300:
            return response
        message = f"Consul {method} {path}: {response.status_code} {response.text.strip()[:300]}"
        status = response.status_code
        if status == 403:
            raise ConsulPermissionDenied(message, status_code=status)
        if status == 404:
            raise ConsulNotFound(message, status_code=status)
        if status >= 500 or status == 429:
            raise ConsulUnavailable(message, status_code=status)
        raise ConsulRequestRejected(message, status_code=status)

"""The stand-in's state for one datacenter: its agent's services and TTL checks, and a Raft-like index.

Pure and synchronous (time is passed in), so the HTTP layer owns all concurrency. Behaviour follows
Consul's agent and catalog (agent/agent.go, agent/checks/check.go, agent/structs), as cited inline.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("passing", "warning", "critical")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_META_KEY = re.compile(r"^[a-zA-Z0-9_-]+$")


class ConsulAPIError(Exception):
    """An error answer: Consul sends these as a text/plain body with the status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string ("10s", "1m30s", "250ms"), as Consul's time.ParseDuration."""
    if text in ("0", ""):
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f'time: invalid duration "{text}"')
    return total


def _lower_keys(body: dict[str, Any]) -> dict[str, Any]:
    # Consul decodes registration bodies case-insensitively (mapstructure), so "name" == "Name".
    return {key.lower(): value for key, value in body.items()}


@dataclass
class Service:
    id: str
    name: str
    tags: list[str]
    address: str
    port: int
    meta: dict[str, str]
    create_index: int
    modify_index: int


@dataclass
class Check:
    check_id: str
    name: str
    service_id: str
    service_name: str
    status: str
    output: str
    notes: str
    ttl_s: float
    deregister_after_s: float | None
    expires_at: float
    critical_since: float | None
    create_index: int
    modify_index: int


@dataclass
class Datacenter:
    """One datacenter with one agent node (all services register on it)."""

    name: str
    node_name: str = ""
    node_address: str = "127.0.0.1"
    # Consul refuses DeregisterCriticalServiceAfter below 1 minute and reaps every 30 s
    # (agent/agent.go: minimum timeout; config check_reap_interval); tests may lower both.
    min_deregister_after_s: float = 60.0
    reap_interval_s: float = 30.0
    index: int = 1
    services: dict[str, Service] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)
    service_index: dict[str, int] = field(default_factory=dict)
    node_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    last_reap: float = 0.0

    def __post_init__(self) -> None:
        self.node_name = self.node_name or f"consul-{self.name}"

    def _bump(self, service_name: str) -> None:
        self.index += 1
        self.service_index[service_name] = self.index

    def query_index(self, service_name: str) -> int:
        # Consul answers with the index of the last change to this service's instances or checks,
        # never below 1 (agent/consul/rpc.go blockingQuery).
        return max(self.service_index.get(service_name, 1), 1)

    def register(self, body: dict[str, Any], now: float) -> None:
        """PUT /v1/agent/service/register (agent/agent_endpoint.go AgentRegisterService)."""
        args = _lower_keys(body)
        name = args.get("name") or ""
        if not isinstance(name, str) or not name:
            raise ConsulAPIError(400, "Missing service name")
        address = args.get("address") or ""
        if address in ("0.0.0.0", "::", "[::]"):
            raise ConsulAPIError(400, "Invalid service address")
        meta = args.get("meta") or {}
        _validate_meta(meta)
        service_id = args.get("id") or name
        port = args.get("port") or 0
        if not isinstance(port, int):
            raise ConsulAPIError(400, "Request decode failed: Port must be a number")
        definitions = [args["check"]] if args.get("check") else list(args.get("checks") or [])
        checks = [
            self._check(d, i, len(definitions), service_id, name, now) for i, d in enumerate(definitions)
        ]
        previous = self.services.get(service_id)
        self._bump(name)
        self.services[service_id] = Service(
            id=service_id,
            name=name,
            tags=list(args.get("tags") or []),
            address=address,
            port=port,
            meta=dict(meta),
            create_index=previous.create_index if previous else self.index,
            modify_index=self.index,
        )
        for check in checks:
            check.create_index = check.modify_index = self.index
            self.checks[check.check_id] = check

    def _check(
        self, raw: dict[str, Any], i: int, count: int, service_id: str, name: str, now: float
    ) -> Check:
        spec = _lower_keys(raw)
        if not spec.get("ttl"):
            raise ConsulAPIError(400, "Invalid check: the Consul stand-in supports TTL checks only")
        try:
            ttl_s = parse_duration(str(spec["ttl"]))
            deregister = spec.get("deregistercriticalserviceafter")
            deregister_s = parse_duration(str(deregister)) if deregister else None
        except ValueError as exc:
            raise ConsulAPIError(400, f"Request decode failed: {exc}") from exc
        status = spec.get("status") or "critical"  # Consul's initial check status
        if status not in STATUSES:
            raise ConsulAPIError(400, "Status for checks must 'passing', 'warning', 'critical'")
        if deregister_s is not None:
            deregister_s = max(deregister_s, self.min_deregister_after_s)
        # One check is "service:<id>"; several are numbered from 1 (agent/structs CheckTypes).
        default_id = f"service:{service_id}" if count == 1 else f"service:{service_id}:{i + 1}"
        return Check(
            check_id=spec.get("checkid") or spec.get("id") or default_id,
            name=spec.get("name") or f"Service '{name}' check",
            service_id=service_id,
            service_name=name,
            status=status,
            output="",
            notes=spec.get("notes") or "",
            ttl_s=ttl_s,
            deregister_after_s=deregister_s,
            expires_at=now + ttl_s,  # the TTL timer starts at registration (CheckTTL.Start)
            critical_since=now if status == "critical" else None,
            create_index=0,
            modify_index=0,
        )

    def deregister(self, service_id: str) -> None:
        service = self.services.pop(service_id, None)
        if service is None:
            raise ConsulAPIError(
                404,
                f'Unknown service ID "{service_id}". Ensure that the service ID is passed, not the service name.',
            )
        for check_id in [c.check_id for c in self.checks.values() if c.service_id == service_id]:
            del self.checks[check_id]
        self._bump(service.name)

    def update_ttl(self, check_id: str, status: str, output: str, now: float) -> None:
        """PUT /v1/agent/check/pass|warn|fail/:check_id."""
        check = self.checks.get(check_id)
        if check is None:
            raise ConsulAPIError(
                404, f'Unknown check ID "{check_id}". Ensure that the check ID is passed, not the check name.'
            )
        check.expires_at = now + check.ttl_s
        self._set_status(check, status, output, now)

    def _set_status(self, check: Check, status: str, output: str, now: float) -> None:
        check.output = output
        if status == check.status:
            # Output-only changes reach the catalog lazily (check_update_interval), so they do
            # not wake blocking queries.
            return
        check.status = status
        check.critical_since = now if status == "critical" else None
        self._bump(check.service_name)
        check.modify_index = self.index

    def tick(self, now: float) -> bool:
        """Expire TTLs and reap long-critical services; True when anything changed."""
        before = self.index
        for check in list(self.checks.values()):
            if check.status != "critical" and now >= check.expires_at:
                self._set_status(
                    check,
                    "critical",
                    f"TTL expired (last output before timeout follows): {check.output}",
                    now,
                )
        if now - self.last_reap >= self.reap_interval_s:
            self.last_reap = now
            for check in list(self.checks.values()):
                limit = check.deregister_after_s
                since = check.critical_since
                if (
                    limit is not None
                    and since is not None
                    and now - since > limit
                    and check.service_id in self.services
                ):
                    self.deregister(check.service_id)
        return self.index != before

    def health_service(self, name: str, passing_only: bool) -> list[dict[str, Any]]:
        """GET /v1/health/service/:name entries, `?passing` keeping only all-passing instances."""
        entries = []
        for service in sorted(self.services.values(), key=lambda s: s.id):
            if service.name != name:
                continue
            checks = [self._serf_check()] + [
                self._check_json(c) for c in self.checks.values() if c.service_id == service.id
            ]
            if passing_only and any(c["Status"] != "passing" for c in checks):
                continue
            entries.append(
                {"Node": self._node_json(), "Service": self._service_json(service), "Checks": checks}
            )
        return entries

    def _node_json(self) -> dict[str, Any]:
        return {
            "ID": self.node_id,
            "Node": self.node_name,
            "Address": self.node_address,
            "Datacenter": self.name,
            "TaggedAddresses": {"lan": self.node_address, "wan": self.node_address},
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": 1,
            "ModifyIndex": 1,
        }

    def _service_json(self, service: Service) -> dict[str, Any]:
        return {
            "ID": service.id,
            "Service": service.name,
            "Tags": list(service.tags),
            "Address": service.address,
            "Meta": dict(service.meta),
            "Port": service.port,
            "Weights": {"Passing": 1, "Warning": 1},
            "EnableTagOverride": False,
            "Datacenter": self.name,
            "CreateIndex": service.create_index,
            "ModifyIndex": service.modify_index,
        }

    def _serf_check(self) -> dict[str, Any]:
        return {
            "Node": self.node_name,
            "CheckID": "serfHealth",
            "Name": "Serf Health Status",
            "Status": "passing",
            "Notes": "",
            "Output": "Agent alive and reachable",
            "ServiceID": "",
            "ServiceName": "",
            "ServiceTags": [],
            "Type": "",
            "CreateIndex": 1,
            "ModifyIndex": 1,
        }

    def _check_json(self, check: Check) -> dict[str, Any]:
        service = self.services[check.service_id]
        return {
            "Node": self.node_name,
            "CheckID": check.check_id,
            "Name": check.name,
            "Status": check.status,
            "Notes": check.notes,
            "Output": check.output,
            "ServiceID": check.service_id,
            "ServiceName": check.service_name,
            "ServiceTags": list(service.tags),
            "Type": "ttl",
            "CreateIndex": check.create_index,
            "ModifyIndex": check.modify_index,
        }


def _validate_meta(meta: Any) -> None:
    """Consul's ValidateServiceMetadata: ≤64 pairs, keys [A-Za-z0-9_-]{1,128} without the
    reserved "consul-" prefix, values ≤512 characters."""
    if not isinstance(meta, dict):
        raise ConsulAPIError(400, "Request decode failed: Meta must be an object of strings")
    if len(meta) > 64:
        raise ConsulAPIError(
            400, "Invalid Service Meta: Node metadata cannot contain more than 64 key/value pairs"
        )
    for key, value in meta.items():
        problem = None
        if not isinstance(value, str):
            problem = "Value must be a string"
        elif not key:
            problem = "Key cannot be blank"
        elif not _META_KEY.match(key):
            problem = "Key contains invalid characters"
        elif len(key) > 128:
            problem = "Key is too long (limit: 128 characters)"
        elif key.startswith("consul-"):
            problem = "Key prefix 'consul-' is reserved for internal use"
        elif len(value) > 512:
            problem = "Value is too long (limit: 512 characters)"
        if problem:
            raise ConsulAPIError(
                400, f"Invalid Service Meta: Couldn't load metadata pair ('{key}', '{value}'): {problem}"
            )

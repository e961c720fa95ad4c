"""Implementation of the Consul API test stand-in; tests import it as `tests.consul_api`.

A TEST STAND-IN for the subset of Consul's HTTP API that Meridian uses. It is not Consul.

No Consul binary can be installed on the machines these tests run on, so this package serves the
few endpoints Meridian calls, over real HTTP on loopback ports, following Consul's API docs
(developer.hashicorp.com/consul/api-docs: agent/service, agent/check, health, "Blocking Queries")
and, where the docs are silent, Consul's source (agent/agent_endpoint.go, agent/consul/rpc.go).

What it reproduces:
- PUT /v1/agent/service/register: JSON body with Name, ID (default: Name), Address, Port, Tags,
  Meta and Check (or Checks) {CheckID, Name, TTL, DeregisterCriticalServiceAfter, Status, Notes};
  keys case-insensitive; 400 "Missing service name", "Invalid service address" (0.0.0.0, ::),
  "Invalid Service Meta: ..." (>64 pairs, key not [A-Za-z0-9_-]{1,128}, "consul-" prefix, value
  >512 chars), "Request decode failed: ..."; re-registering an ID replaces it.
- PUT /v1/agent/service/deregister/:id: 200, or 404 'Unknown service ID "..."'.
- PUT /v1/agent/check/pass|warn|fail/:check_id?note=...: the note becomes Output; 404 'Unknown
  check ID "..."'. A service's single check is "service:<ID>" unless CheckID is given.
- TTL checks start "critical" (unless Status says otherwise); the TTL timer starts at
  registration and restarts on every update; expiry → critical with Output "TTL expired ...".
- DeregisterCriticalServiceAfter: a service whose check has been critical longer than that is
  removed by a reaper that runs every `reap_interval_s`. Consul clamps the timeout to >= 1 minute
  and reaps every 30 s; both are the defaults here and tests may lower them.
- GET /v1/health/service/:name[?passing][&dc=][&index=&wait=]: the [{Node, Service, Checks}] shape
  (Checks include the node's "serfHealth"); `passing` keeps instances whose checks all pass;
  unknown dc → 500 "No path to datacenter". Service.Address is sent empty when registered empty.
- Blocking queries: X-Consul-Index on every answer (never below 1; it moves when this service's
  instances or check statuses change); with index=N the request returns at once if the index is
  already past N, wakes as soon as it moves past N, or answers at the end of `wait` ("5s", "1m";
  default 5 m, capped at 10 m, plus up to wait/16 of jitter) with the same index. An output-only
  TTL update does not move the index (Consul syncs those lazily).
- GET /v1/status/leader → "127.0.0.1:8300".
- ACLs when `acl_token` is set (default policy deny): the token is read from X-Consul-Token,
  "Authorization: Bearer" or ?token=; an unknown token → 403 "ACL not found"; the anonymous token
  (none sent) → 403 "Permission denied: ..." on writes, and on reads an empty result with
  X-Consul-Results-Filtered-By-ACLs: true. Status endpoints need no token.
- Datacenters: one agent (own port) per datacenter, WAN-federated, so `?dc=` on any agent reads
  any datacenter while agent writes land in the agent's own one, as with real Consul.
- Outages: stop() resets every open connection (blocked queries included) and stops listening;
  start()/restart() listen again on the same ports, keeping the catalog (restart(keep_state=True))
  or starting empty with a fresh index (keep_state=False).

What it does not: other endpoints, HTTP/TCP/script checks, sessions, KV, Connect, namespaces,
`filter`/`tag`/`near` parameters, consistency modes, anti-entropy, Raft (one "server", always
leader), gossip (the node check is always passing), TLS.
"""

from tests.consul_stand_in.catalog import ConsulAPIError, Datacenter, parse_duration
from tests.consul_stand_in.server import ConsulStandIn

__all__ = ["ConsulAPIError", "ConsulStandIn", "Datacenter", "parse_duration"]

"""A node pod's probe and drain, run by Kubernetes inside the node container (mounted from a
ConfigMap, so changing them needs no new image).

    python lifecycle.py ready                  exit 0 iff the node's /ready answers 200
    python lifecycle.py drain --config FILE    preStop: out of routing, then wait for the work

`ready` backs the startup and readiness probes. /ready sits behind the node credential and an
httpGet probe cannot send a header from a Secret, hence an exec probe; it imports only the standard
library because it runs every few seconds.

`drain` puts the node's Consul service into maintenance: a critical check of its own that the
node's TTL heartbeats never reset (failing the TTL check would last until the next heartbeat, and
deregistering would make the node register again). Every gateway's Consul watch then drops the
node, while the streams it serves go on. It waits until /load shows no running or waiting request,
at most --timeout-s; then Kubernetes sends SIGTERM, the node stops and deregisters, and the
maintenance goes with the service. Nothing here may hold a termination past its deadline: with
Consul unreachable it still waits for the work, and a stream cut at SIGTERM is continued
token-exact on another node by the gateway.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

MAINTENANCE_REASON = "draining before pod termination"


def _auth_headers() -> dict[str, str]:
    token = (os.environ.get("MERIDIAN_NODE_TOKEN") or "").strip()  # stripped as the node strips it
    return {"authorization": f"Bearer {token}"} if token else {}


def ready(node_url: str, timeout_s: float) -> int:
    request = urllib.request.Request(f"{node_url}/ready", headers=_auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:  # HTTPError (503 while loading) included
        print(f"not ready: {exc}", file=sys.stderr)
        return 1


def drain(
    config_path: Path,
    node_url: str,
    node_id: str,
    host: str,
    *,
    timeout_s: float,
    settle_s: float,
    poll_s: float,
) -> int:
    # Imported here: `ready` runs every few seconds and needs none of this.
    import httpx
    import msgspec
    import yaml

    from protocol.consul.client import _ssl_context  # the node's own TLS settings, as its client uses them
    from protocol.load import LoadReport
    from regional_node.discovery.consul_registration import ConsulRegistrationConfig, build_registration

    deadline = time.monotonic() + timeout_s
    raw = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    if raw.get("consul") is not None:
        consul = msgspec.convert(raw["consul"], ConsulRegistrationConfig)
        # The very service id the node registered under (same function, same inputs).
        service_id = build_registration(
            consul,
            node_id=node_id,
            region=raw.get("region", "local"),
            jurisdiction=raw.get("jurisdiction", "local"),
            host=host,
            port=int(raw.get("port", 8100)),
            models=[(m["name"], m.get("tier", "small")) for m in raw.get("models", [])],
        ).ID
        token = consul.resolved_token()
        try:
            response = httpx.put(
                f"{consul.base_url()}/v1/agent/service/maintenance/{quote(service_id, safe='')}",
                params={"enable": "true", "reason": MAINTENANCE_REASON},
                headers={"X-Consul-Token": token} if token else {},
                verify=_ssl_context(consul.tls),
                timeout=consul.request_timeout_s,
                trust_env=False,
            )
            response.raise_for_status()
            print(f"{service_id}: in maintenance, gateways stop routing here", file=sys.stderr)
        except httpx.HTTPError as exc:
            print(f"{service_id}: could not enter maintenance ({exc}); draining anyway", file=sys.stderr)
    # A request routed just before the gateways saw the change may still be on its way.
    time.sleep(min(settle_s, max(0.0, deadline - time.monotonic())))
    while True:
        try:
            answer = httpx.get(
                f"{node_url}/load", headers=_auth_headers(), timeout=poll_s + 2, trust_env=False
            )
            load = msgspec.json.decode(answer.raise_for_status().content, type=LoadReport)
        except (httpx.HTTPError, msgspec.DecodeError) as exc:
            print(f"node unreachable ({exc}): nothing left to drain", file=sys.stderr)
            return 0
        if load.num_running == 0 and load.num_waiting == 0:
            print("drained: no running or waiting requests", file=sys.stderr)
            return 0
        if time.monotonic() >= deadline:
            print(f"drain deadline: {load.num_running} running, {load.num_waiting} waiting", file=sys.stderr)
            return 0
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lifecycle.py", description=__doc__.split("\n\n")[0])
    # MERIDIAN_NODE_URL is http://$(POD_IP):PORT in the pod: the node listens on the pod IP.
    parser.add_argument("--url", default=os.environ.get("MERIDIAN_NODE_URL", "http://127.0.0.1:8100"))
    commands = parser.add_subparsers(dest="command", required=True)
    probe = commands.add_parser("ready", help="exit 0 iff /ready answers 200")
    probe.add_argument("--timeout-s", type=float, default=3.0)
    stop = commands.add_parser("drain", help="Consul maintenance on, then wait until idle")
    stop.add_argument("--config", type=Path, required=True, help="the node's YAML config")
    stop.add_argument("--node-id", default=os.environ.get("POD_NAME", ""), help="as given to the node")
    stop.add_argument("--host", default=os.environ.get("POD_IP", ""), help="as given to the node")
    stop.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for running requests")
    stop.add_argument("--settle-s", type=float, default=2.0, help="least wait after leaving routing")
    stop.add_argument("--poll-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.command == "ready":
        return ready(args.url, args.timeout_s)
    return drain(
        args.config,
        args.url,
        args.node_id,
        args.host,
        timeout_s=args.timeout_s,
        settle_s=args.settle_s,
        poll_s=args.poll_s,
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""A local server of the subset of Consul's HTTP API that Meridian uses — a TEST STAND-IN, not Consul.

No Consul binary can be installed on the machines Meridian's tests run on. This module is the
stand-in the tests use; its implementation lives in `tests/consul_stand_in/` (split to keep
modules small), whose package docstring lists exactly which Consul behaviour it reproduces:
agent service register/deregister, TTL check pass/warn/fail and expiry, health service with
`passing`, blocking queries with `X-Consul-Index`/`index`/`wait`, DeregisterCriticalServiceAfter
reaping, ACL tokens, several datacenters, and outages (stop/restart on the same port).

Run it by hand for a local try of the Consul directory:
    .venv/bin/python -m tests.consul_api --dc dc1 --dc dc2
"""

from __future__ import annotations

import argparse
import time

from tests.consul_stand_in import ConsulAPIError, ConsulStandIn, Datacenter, parse_duration

__all__ = ["ConsulAPIError", "ConsulStandIn", "Datacenter", "parse_duration"]


def main() -> None:
    parser = argparse.ArgumentParser(description="Consul API test stand-in on loopback ports")
    parser.add_argument("--dc", action="append", help="datacenter name (repeatable)")
    parser.add_argument("--acl-token", default=None)
    args = parser.parse_args()
    stand_in = ConsulStandIn(tuple(args.dc or ["dc1"]), acl_token=args.acl_token).start()
    for dc in stand_in.datacenter_names:
        print(f"consul stand-in datacenter {dc} at {stand_in.url(dc)}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stand_in.stop()


if __name__ == "__main__":
    main()

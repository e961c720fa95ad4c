"""One load process for the cross-process tests: `python -m tests.quota.load_worker SPEC_JSON`.

Like one gateway replica's quota traffic: builds its own gate from the shared Redis config,
waits for the common start time, fires its share of requests for each tenant at once, holds each
admitted one for a while, settles it, and prints one JSON line per request:
{"tenant", "admitted", "start", "admitted_at", "released_at", "estimate", "actual"}.
With `"hold_forever": true` it admits what it can, prints "HELD n" and sleeps (to be SIGKILLed).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import msgspec

from gateway.quota import QuotaConfig, QuotaExceeded, build_quota_gate
from router.types import TenantLimits, TenantPolicy


def policy_from(spec: dict[str, Any]) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=spec["tenant_id"],
        api_key_hashes=frozenset(),
        limits=TenantLimits(**spec["limits"]),
        fail_mode=spec.get("fail_mode", "open"),
    )


async def one_request(
    gate: Any, tenant: dict[str, Any], policy: TenantPolicy, rng: random.Random, n: int
) -> dict:
    estimate = rng.randint(*tenant["estimate"])
    actual = int(estimate * tenant.get("used_share", 1.0))
    record: dict[str, Any] = {
        "tenant": policy.tenant_id,
        "admitted": False,
        "start": time.time(),
        "estimate": estimate,
    }
    deadline = time.monotonic() + tenant.get("retry_for_s", 0.0)
    while True:
        try:
            admission = await gate.admit(policy, request_id=f"{n}", estimated_tokens=estimate)
            break
        except QuotaExceeded:
            if time.monotonic() >= deadline:
                return record
            await asyncio.sleep(rng.uniform(0.005, 0.03))
    record.update(admitted=True, admitted_at=time.time(), actual=actual)
    await asyncio.sleep(rng.uniform(*tenant.get("hold_s", (0.0, 0.0))))
    record["released_at"] = time.time()
    await gate.settle(admission, actual_tokens=actual)
    return record


async def main(spec: dict[str, Any]) -> None:
    gate = build_quota_gate(msgspec.convert(spec["quota"], QuotaConfig))
    rng = random.Random(spec.get("seed", 0))
    try:
        if spec.get("hold_forever"):
            tenant = spec["tenants"][0]
            policy, held = policy_from(tenant), 0
            for n in range(tenant["requests"]):
                try:
                    await gate.admit(policy, request_id=f"hold-{n}", estimated_tokens=1)
                    held += 1
                except QuotaExceeded:
                    pass
            print(f"HELD {held}", flush=True)
            await asyncio.sleep(3600)
        await asyncio.sleep(max(0.0, spec["start_at"] - time.time()))
        jobs = [
            one_request(gate, tenant, policy_from(tenant), rng, n)
            for tenant in spec["tenants"]
            for n in range(tenant["requests"])
        ]
        for record in await asyncio.gather(*jobs):
            print(json.dumps(record))
    finally:
        await gate.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))

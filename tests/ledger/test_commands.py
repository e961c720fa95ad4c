"""`meridian ledger` (the external worker, SIGKILLed mid-run) and `meridian usage export`."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.asyncio import Redis

from gateway.ledger.event import encode_event
from gateway.ledger.store.interface import AggregateQuery
from gateway.ledger.store.sqlite import SqliteLedger
from gateway.quota import MemoryQuotaStore, RedisQuotaStore, StoreQuotaGate
from router.types import TenantLimits, TenantPolicy
from tests.ledger.conftest import DAY_MS, T0_MS, event
from tests.quota.gateway_setup import write_gateway_config
from tests.support.processes import REPO_ROOT, free_port


def config_file(folder: Path, **sections: Any) -> Path:
    path = write_gateway_config(
        folder, node_url=f"http://127.0.0.1:{free_port()}", tenants=[{"id": "acme", "limits": {}}], quota=None
    )
    data = yaml.safe_load(path.read_text())
    data.update(sections)
    path.write_text(yaml.safe_dump(data))
    return path


def meridian(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meridian.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


async def fill(path: Path) -> None:
    store = SqliteLedger(path)
    await store.start()
    await store.commit(
        [event(f"a{i}", ts_ms=T0_MS + i * 3_600_000, completion_tokens=i) for i in range(30)]
        + [event("b1", tenant_id="beta", ts_ms=T0_MS + 5)]
    )
    await store.close()


def test_export_writes_the_days_events_as_csv(tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path / "ledger.sqlite"))
    config = config_file(tmp_path, ledger={"store": {"path": "ledger.sqlite"}})
    done = meridian("usage", "export", "--config", str(config), "--from", "2026-11-01", "--to", "2026-11-02")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert len(rows) == 25  # 24 hours of acme, and beta's one
    assert rows[0]["request_id"] == "a0" and rows[0]["tenant_id"] == "acme"
    assert sum(int(r["completion_tokens"]) for r in rows if r["tenant_id"] == "acme") == sum(range(24))
    assert rows[0]["queue_wait_ms"] == ""  # unknown, not zero


def test_export_of_one_tenant_as_jsonl(tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path / "ledger.sqlite"))
    config = config_file(tmp_path, ledger={"store": {"path": "ledger.sqlite"}})
    out = tmp_path / "beta.jsonl"
    done = meridian(
        "usage", "export", "--config", str(config), "--from", str(T0_MS // 1000), "--to", "2026-12-01T00:00:00Z",
        "--tenant", "beta", "--format", "jsonl", "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [line] = out.read_text().splitlines()
    assert json.loads(line)["request_id"] == "b1"


@pytest.mark.parametrize(
    ("start", "end", "says"),
    [("yesterday", "2026-11-02", "--from/--to"), ("2026-11-02", "2026-11-01", "--to must be after")],
)
def test_export_refuses_bad_times(tmp_path: Path, start: str, end: str, says: str) -> None:
    config = config_file(tmp_path)
    done = meridian("usage", "export", "--config", str(config), "--from", start, "--to", end)
    assert done.returncode == 2 and says in done.stderr


def test_ledger_worker_needs_redis(tmp_path: Path) -> None:
    done = meridian("ledger", "--config", str(config_file(tmp_path)))
    assert done.returncode == 2 and "quota.redis_url" in done.stderr


EVENTS = 2000


async def settle_many(redis_url: str, prefix: str) -> None:
    client = Redis.from_url(redis_url)
    gate = StoreQuotaGate(
        RedisQuotaStore(client, key_prefix=prefix, timeout_s=5.0, congested_s=10.0),
        fallback=MemoryQuotaStore(name="local"),
    )
    policy = TenantPolicy(tenant_id="acme", api_key_hashes=frozenset(), limits=TenantLimits())

    async def one(i: int) -> None:
        admission = await gate.admit(policy, request_id=f"r{i}", estimated_tokens=10)
        data = encode_event(event(f"r{i}", tenant_id="acme", completion_tokens=2))
        await gate.settle(admission, actual_tokens=10, event=data)

    for start in range(0, EVENTS, 50):  # within the client's connection pool
        await asyncio.gather(*(one(i) for i in range(start, start + 50)))
    await client.aclose()


async def ledger_totals(path: Path) -> tuple[int, int]:
    store = SqliteLedger(path)
    try:
        rows = await store.aggregate(AggregateQuery("1d", T0_MS - DAY_MS, T0_MS + DAY_MS, "acme"))
    except Exception:
        return 0, 0  # not created yet
    finally:
        await store.close()
    return sum(r.requests for r in rows), sum(r.output_tokens for r in rows)


@pytest.mark.slow
def test_a_ledger_worker_sigkilled_mid_run_counts_nothing_twice(redis_server: str, tmp_path: Path) -> None:
    prefix = f"lc{uuid.uuid4().hex[:6]}"
    asyncio.run(settle_many(redis_server, prefix))
    quota = {"redis_url": redis_server, "key_prefix": prefix}
    ledger = {
        "worker": "external",
        "store": {"path": "ledger.sqlite"},
        "batch_size": 40,
        "poll_interval_ms": 20,
        "claim_idle_ms": 300,
    }
    config = config_file(tmp_path, quota=quota, ledger=ledger)
    command = [sys.executable, "-m", "meridian.cli", "ledger", "--config", str(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    logs = tmp_path / "workers.log"  # every worker's output, shown if the last one does not stop

    def start_worker() -> subprocess.Popen[bytes]:
        with logs.open("ab") as log:
            return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    kills = 0
    for _ in range(3):  # three workers killed part-way, at whatever point they reached
        process = start_worker()
        deadline = time.monotonic() + 60
        start = asyncio.run(ledger_totals(tmp_path / "ledger.sqlite"))[0]
        while asyncio.run(ledger_totals(tmp_path / "ledger.sqlite"))[0] < min(EVENTS, start + 400):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        kills += 1
        if asyncio.run(ledger_totals(tmp_path / "ledger.sqlite"))[0] == EVENTS:
            break
    last = start_worker()
    try:
        deadline = time.monotonic() + 60
        while (
            asyncio.run(ledger_totals(tmp_path / "ledger.sqlite"))[0] < EVENTS and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        time.sleep(1.0)  # redeliveries of the killed workers' batches (claim_idle_ms 300) land too
    finally:
        last.send_signal(signal.SIGTERM)
        try:
            # It finishes the batch in hand first; a loaded 2-core CI box can take a while.
            code = last.wait(timeout=60)
        except subprocess.TimeoutExpired:
            last.send_signal(signal.SIGABRT)  # meridian's CLI prints each thread's stack on it
            last.wait(timeout=10)
            code = None
        assert code == 0, logs.read_text()[-4000:]
    assert kills >= 1
    assert asyncio.run(ledger_totals(tmp_path / "ledger.sqlite")) == (EVENTS, 2 * EVENTS)

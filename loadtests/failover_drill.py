"""Failover drill: bounded locust load on a running `make up`, with one node SIGKILLed midway.

    make up                                    # terminal 1
    MERIDIAN_API_KEY=... .venv/bin/python loadtests/failover_drill.py --duration 60 --kill-after 20

It reads the node processes from `<state-dir>/run.json` (written by `meridian up`), runs locust
headless for `--duration` seconds, kills the chosen node at `--kill-after`, then reads locust's
CSV output. The drill passes when no non-streaming request failed and every stream either
completed or ended with an error event (never a hang or a broken connection), which is the
gateway's promise under failover. Needs the `loadtest` extra (`make loadtest` installs it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A stream that ends with an OpenAI-style error event is an allowed outcome of a failover.
ALLOWED_STREAM_FAILURE = "stream error event"


def pick_node(run_file: Path, wanted: str | None) -> dict:
    nodes = json.loads(run_file.read_text())["nodes"]
    for node in nodes:
        if wanted in (None, node["node_id"], node["region"]):
            return node
    raise SystemExit(f"no node matching {wanted!r} in {run_file}: {[n['node_id'] for n in nodes]}")


def run_locust(args: argparse.Namespace, csv_prefix: Path, victim: dict) -> int:
    command = [
        sys.executable, "-m", "locust", "-f", str(Path(__file__).with_name("locustfile.py")),
        "--host", args.gateway, "--headless", "-u", str(args.users), "-r", str(args.users),
        "--run-time", f"{args.duration}s", "--stop-timeout", "65", "--csv", str(csv_prefix),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with subprocess.Popen(command, env=env) as locust:
        time.sleep(args.kill_after)
        print(
            f"drill: SIGKILL node {victim['node_id']} (pid {victim['pid']}, {victim['region']})", flush=True
        )
        os.kill(victim["pid"], signal.SIGKILL)
        # Bounded: locust stops itself after --run-time plus the in-flight requests' timeouts.
        return locust.wait(timeout=args.duration + 120)


def judge(csv_prefix: Path) -> tuple[int, list[str]]:
    """Total requests, and the failures that break the drill's promise."""
    total = 0
    with open(f"{csv_prefix}_stats.csv") as stats:
        for row in csv.DictReader(stats):
            if row["Name"] != "Aggregated" and row["Type"] != "SSE":
                total += int(row["Request Count"])
    broken = []
    with open(f"{csv_prefix}_failures.csv") as failures:
        for row in csv.DictReader(failures):
            allowed = row["Name"] == "chat stream" and ALLOWED_STREAM_FAILURE in row["Error"]
            if not allowed:
                broken.append(f"{row['Name']}: {row['Error']} (x{row['Occurrences']})")
    return total, broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=Path(os.environ.get("MERIDIAN_HOME", ".meridian")))
    parser.add_argument("--gateway", default=None, help="gateway URL (default: from run.json)")
    parser.add_argument("--node", default=None, help="node id or region to kill (default: the first)")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--duration", type=int, default=60)
    parser.add_argument("--kill-after", type=int, default=20)
    args = parser.parse_args()
    run_file = args.state_dir / "run.json"
    if not run_file.exists():
        raise SystemExit(f"{run_file} not found: start the federation with `make up` first")
    args.gateway = args.gateway or json.loads(run_file.read_text())["gateway"]
    victim = pick_node(run_file, args.node)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "drill"
        run_locust(args, prefix, victim)
        total, broken = judge(prefix)
    print(f"drill: {total} requests; {len(broken)} kinds of failure outside the promise")
    for line in broken:
        print("  " + line)
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())

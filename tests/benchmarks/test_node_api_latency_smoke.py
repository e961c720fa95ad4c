"""benchmarks/node_api_latency.py runs briefly on our engine and writes its JSON (no timing
assertions: this only keeps the benchmark from rotting; the vLLM runs are the same code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_node_api_latency_benchmark_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "node_api_latency.json"
    command = [sys.executable, str(REPO / "benchmarks" / "node_api_latency.py")]
    command += ["--engines", "meridian", "--shares", "default", "--streams", "1", "--seconds", "1"]
    done = subprocess.run(
        [*command, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert (result["engine"], result["share"]) == ("meridian", "default")
    assert set(result["endpoints"]) == {"health", "ready", "load"}
    assert all(stats["n"] > 0 and stats["p99_ms"] > 0 for stats in result["endpoints"].values())
    assert "p99 ms" in done.stdout

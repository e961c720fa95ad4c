"""benchmarks/safety.py runs with --quick and writes its JSON (no timing assertions: this only
keeps the benchmark from rotting)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_safety_benchmark_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "safety.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "safety.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert set(result["rules"]) == {"1kb", "4kb", "16kb"}
    assert {"p50", "p95", "p99"} <= set(result["rules"]["1kb"]["ms_per_kb"])
    assert {"p50", "p95", "p99"} <= set(result["rules"]["1kb"]["cpu_ms_per_kb"])
    assert result["classifier"]["labels"] == ["injection", "toxicity"]
    assert result["stream"]["hold_back_chars"] == 128
    assert "rules p95" in done.stdout

"""benchmarks/quota.py runs end to end and reports one round trip per admission and settlement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO_ROOT


def test_quota_benchmark_counts_one_round_trip_each(tmp_path: Path) -> None:
    out = tmp_path / "quota.json"
    command = [
        sys.executable,
        "benchmarks/quota.py",
        "--seconds",
        "0.2",
        "--sequential",
        "50",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["sequential"]["round_trips_per_admission"] == 1.0
    assert result["sequential"]["round_trips_per_settlement"] == 1.0
    assert result["sequential"]["server_evalsha_per_request"] == 2.0
    assert result["sequential"]["server_xadd_per_settlement"] == 1.0  # the usage event, in the same EVALSHA
    assert result["concurrent"]["admissions"] > 0

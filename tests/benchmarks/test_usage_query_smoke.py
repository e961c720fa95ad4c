"""benchmarks/usage_query.py runs end to end on a small ledger and reports every scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO_ROOT


def test_usage_query_benchmark_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "usage_query.json"
    command = [
        sys.executable,
        "benchmarks/usage_query.py",
        "--events",
        "3000",
        "--queries",
        "5",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["events"] == 3000
    daily = result["scenarios"]["tenant_31d_daily"]
    assert daily["buckets"] == 31 and daily["queries"] == 5
    assert set(result["scenarios"]) == {
        "tenant_31d_daily",
        "tenant_31d_by_model",
        "operator_31d_by_tenant",
        "tenant_7d_hourly",
    }

"""`meridian safety`: the demo model a gateway can load, the audit query, and a gateway that
starts without ONNX Runtime installed when no classifier is configured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meridian.cli import main
from tests.support.processes import REPO_ROOT


def test_init_model_writes_a_model_the_classifier_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["safety", "init-model", str(tmp_path / "m"), "--category", "spam=buy,cheap"]) == 0
    assert "labels: spam" in capsys.readouterr().out
    from gateway.safety.classifier import OnnxModel

    model = OnnxModel(tmp_path / "m", max_tokens=16, threads_per_run=1)
    assert model.labels == ("spam",)
    assert model.scores("Buy it now")["spam"] > 0.9 > 0.1 > model.scores("hello")["spam"]


def test_audit_query_filters_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    records = [
        {"request_id": "r1", "tenant": "a", "where": "input", "action": "block"},
        {"request_id": "r2", "tenant": "b", "where": "output", "action": "pass"},
        {"request_id": "r3", "tenant": "a", "where": "output", "action": "pass"},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["safety", "audit", str(log), "--tenant", "a", "--where", "output"]) == 0
    assert [json.loads(line)["request_id"] for line in capsys.readouterr().out.splitlines()] == ["r3"]


def test_the_gateway_builds_and_starts_without_onnxruntime_when_no_classifier_is_configured(
    tmp_path: Path,
) -> None:
    script = f"""
import asyncio, sys
sys.modules["onnxruntime"] = None  # as if not installed: importing it raises ImportError
sys.modules["onnx"] = None
from gateway.app import build_gateway
from tests.support.gateway_config import gateway_config
config = gateway_config(policies={str(REPO_ROOT / "policies")!r}, directory={{"type": "static", "file": {str(tmp_path / "r.yaml")!r}}})
gateway = build_gateway(config, env={{}})
async def run():
    await gateway.safety.start()
    assert gateway.safety.ready
    await gateway.safety.stop()
asyncio.run(run())
print("ok")
"""
    (tmp_path / "r.yaml").write_text("nodes: []\n")
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip().endswith("ok"), done.stderr


def test_log_lines_and_tracebacks_are_redacted(tmp_path: Path) -> None:
    import logging

    from gateway.safety.logs import install_redaction

    log = logging.getLogger("test-redaction")
    handler = logging.FileHandler(tmp_path / "log.txt")
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    log.propagate = False
    install_redaction(log)
    try:
        try:
            raise ValueError("bad prompt with AKIAIOSFODNN7EXAMPLE")
        except ValueError:
            log.exception("request from %s failed", "jane@example.com")
    finally:
        handler.close()
    written = (tmp_path / "log.txt").read_text()
    assert written.startswith("ERROR request from [REDACTED:email] failed")
    assert "ValueError: bad prompt with [REDACTED:aws_access_key]" in written
    assert "AKIA" not in written and "jane@" not in written

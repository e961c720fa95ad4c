"""The shipped example policies load and say what their comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy import load_policy_dir
from gateway.policy.__main__ import main

EXAMPLES = Path(__file__).resolve().parents[2] / "policies"


def test_shipped_examples_load() -> None:
    policies = load_policy_dir(EXAMPLES)

    assert set(policies.by_id) == {"acme-eu", "initech-us", "globex-batch"}


def test_eu_example_is_pinned_to_the_eu_and_interactive() -> None:
    eu = load_policy_dir(EXAMPLES).by_id["acme-eu"]

    assert eu.residency.jurisdictions == {"eu"}
    assert eu.traffic_tier == "interactive"
    assert not eu.allow_commercial


def test_global_batch_example_may_run_anywhere_and_degrade() -> None:
    batch = load_policy_dir(EXAMPLES).by_id["globex-batch"]

    assert batch.residency.allows("ap-south", "in")
    assert batch.traffic_tier == "batch"
    assert batch.allow_degrade


def test_check_command_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLES)]) == 0
    assert "3 tenants OK" in capsys.readouterr().out


def test_check_command_reports_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("tenants:\n  - id: a\n    api_keys: []\n    tier: fast\n")

    assert main(["check", str(tmp_path)]) == 1
    assert f"{tmp_path}/bad.yaml: tenants[0].tier:" in capsys.readouterr().err


def test_hash_key_command_prints_the_policy_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hash-key", "sk-meridian-eu-example"]) == 0
    assert capsys.readouterr().out.strip() == (
        "sha256:9332592c7dde541669174cfa746655e874222cf4440c1169b74903669dc23978"
    )

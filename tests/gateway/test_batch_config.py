"""`batches:` in the gateway config: checked and resolved at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.batches.batches import build_batches
from gateway.config import ConfigError, config_from_dict
from gateway.ledger.build import LedgerConfigError
from tests.gateway.conftest import gateway_config


def test_storage_dir_is_relative_to_the_config_file(tmp_path: Path) -> None:
    data = gateway_config(tmp_path / "regions.yaml", batches={"enabled": True, "storage_dir": "files"})
    config = config_from_dict(data, base_dir=tmp_path)
    assert config.batches.storage_dir == str(tmp_path / "files")


def test_batches_on_a_postgres_ledger_need_its_dsn(tmp_path: Path) -> None:
    data = gateway_config(
        tmp_path / "regions.yaml", ledger={"store": {"type": "postgres", "dsn_env": "NO_SUCH_DSN_VARIABLE"}}
    )
    config = config_from_dict(data, base_dir=tmp_path)
    assert config.batches.enabled  # on by default
    with pytest.raises(LedgerConfigError, match="NO_SUCH_DSN_VARIABLE"):
        build_batches(config.batches, config.ledger.store, {}, None, None, None)  # type: ignore[arg-type]


def test_a_poll_longer_than_a_third_of_the_lease_is_refused(tmp_path: Path) -> None:
    data = gateway_config(tmp_path / "regions.yaml", batches={"lease_s": 3, "poll_interval_s": 2})
    with pytest.raises(ConfigError, match="poll_interval_s"):
        config_from_dict(data, base_dir=tmp_path)

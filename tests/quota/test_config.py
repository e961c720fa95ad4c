"""The `quota` section: which store it gives, and mistakes named by field at start-up."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError
from gateway.quota import MemoryQuotaStore, QuotaConfig, RedisQuotaStore, build_quota_gate
from tests.support.gateway_config import gateway_config


def quota_config(section: Any) -> QuotaConfig:
    return gateway_config(quota=section).quota


@pytest.mark.parametrize("section", [None, {}])
async def test_no_redis_configured_means_in_process_store(section: dict | None) -> None:
    gate = build_quota_gate(quota_config(section))
    assert isinstance(gate._store, MemoryQuotaStore)
    await gate.close()


async def test_redis_url_gives_redis_store_with_settings() -> None:
    gate = build_quota_gate(
        quota_config(
            {"redis_url": "redis://127.0.0.1:1/0", "timeout_ms": 80, "local_share": 0.5, "key_prefix": "q"}
        )
    )
    assert isinstance(gate._store, RedisQuotaStore)
    assert gate._store.keys("t").tokens == "q:{t}:tokens"
    await gate.close()


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"timeout_ms": 0}, "quota.timeout_ms"),
        ({"timeout_ms": "fast"}, "quota.timeout_ms"),
        ({"local_share": 1.5}, "quota.local_share"),
        ({"local_share": 0}, "quota.local_share"),
        ({"key_prefix": "a{b"}, "quota.key_prefix"),
        ({"lease_ms": 10}, "quota.lease_ms"),
        ({"redis_url": "http://x"}, "quota.redis_url"),
        ({"cluster": True}, "quota.cluster"),
        ({"timeout_ms": 500, "congested_timeout_ms": 400}, "quota.congested_timeout_ms"),
        ({"redis_ulr": "redis://x"}, "redis_ulr"),
    ],
)
def test_invalid_section_names_the_field(section: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        quota_config(section)


def test_section_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="quota: expected a mapping"):
        quota_config(["redis://x"])


def test_bad_redis_url_error_does_not_reveal_its_password() -> None:
    """Config errors end up in start-up logs; the URL's password must not."""
    with pytest.raises(ConfigError, match=r"quota\.redis_url") as info:
        quota_config({"redis_url": "http://default:s3cr3t-pass@redis.internal:6379/0"})
    assert "s3cr3t-pass" not in str(info.value)


def test_cross_field_rules_hold_for_a_struct_built_in_code_too() -> None:
    with pytest.raises(ValueError, match="congested_timeout_ms"):
        QuotaConfig(timeout_ms=500, congested_timeout_ms=400)

"""build_quota_gate: which store a config section gives, and errors that name the field."""

from __future__ import annotations

import pytest

from gateway.quota import MemoryQuotaStore, QuotaConfigError, RedisQuotaStore, build_quota_gate


@pytest.mark.parametrize("section", [None, {}])
async def test_no_redis_configured_means_in_process_store(section: dict | None) -> None:
    gate = build_quota_gate(section)
    assert isinstance(gate._store, MemoryQuotaStore)
    await gate.close()


async def test_redis_url_gives_redis_store_with_settings() -> None:
    gate = build_quota_gate(
        {"redis_url": "redis://127.0.0.1:1/0", "timeout_ms": 80, "local_share": 0.5, "key_prefix": "q"}
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
        ({"redis_ulr": "redis://x"}, "redis_ulr"),
    ],
)
def test_invalid_section_names_the_field(section: dict, field: str) -> None:
    with pytest.raises(QuotaConfigError, match=field.replace(".", r"\.")):
        build_quota_gate(section)


def test_section_must_be_a_mapping() -> None:
    with pytest.raises(QuotaConfigError, match="quota: expected a mapping"):
        build_quota_gate(["redis://x"])  # type: ignore[arg-type]


def test_bad_redis_url_error_does_not_reveal_its_password() -> None:
    """Config errors end up in start-up logs; the URL's password must not."""
    with pytest.raises(QuotaConfigError, match=r"quota\.redis_url") as info:
        build_quota_gate({"redis_url": "http://default:s3cr3t-pass@redis.internal:6379/0"})
    assert "s3cr3t-pass" not in str(info.value)

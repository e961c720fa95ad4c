"""Every key of a tenant lives in one Redis Cluster slot, so scripts work on Redis Cluster."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from gateway.quota.keys import TenantKeys


def crc16_slot(key: str) -> int:
    """Redis Cluster's HASH_SLOT, written out: CRC16-XMODEM of the hash tag, mod 16384."""
    data = key.encode()
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc % 16384


def test_tenant_keys_share_the_tenant_hash_tag() -> None:
    keys = TenantKeys.for_tenant("mq", "acme")
    assert keys.all() == ("mq:{acme}:requests", "mq:{acme}:tokens", "mq:{acme}:leases", "mq:{acme}:daily")


@given(
    tenant_id=st.text(max_size=40),
    prefix=st.text(min_size=1, max_size=8).filter(lambda p: "{" not in p and "}" not in p),
)
def test_every_key_of_a_tenant_maps_to_one_cluster_slot(tenant_id: str, prefix: str) -> None:
    keys = TenantKeys.for_tenant(prefix, tenant_id).all()
    assert len({crc16_slot(k) for k in keys}) == 1
    assert len({key_slot(k.encode()) for k in keys}) == 1  # redis-py's implementation agrees


def test_other_tenants_use_other_keys() -> None:
    assert set(TenantKeys.for_tenant("mq", "a").all()).isdisjoint(TenantKeys.for_tenant("mq", "b").all())
    assert set(TenantKeys.for_tenant("mq", "{x}").all()).isdisjoint(TenantKeys.for_tenant("mq", "x").all())
